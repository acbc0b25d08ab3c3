//! The box table: every box's reduced state and pre-rendered payload, shared by
//! all workers. This is where a box is updated, removed (`DELETE`) and expired
//! (SPEC §3, §3a).
//!
//! # Layout
//!
//! The table is split into [`SHARDS`] shards chosen by the key's hash (a keyed
//! foldhash with a random seed per table). A shard has a map readers find
//! boxes through without locking anything: an index (open addressing, linear
//! probing, one `AtomicU64` per bucket holding a 32-bit fingerprint of the
//! key's hash and a slot number) and a directory of chunks of slots, which
//! never move while published. A slot (`slot.rs`, 32 bytes) is a seqlock: a
//! sequence counter and a pointer to one record holding everything about the
//! box, stored as `AtomicU64` words so readers can copy it while a writer
//! stores:
//!
//! ```text
//! record = version u64 | key_len u16 | payload_len u32 | 0 u16 | payload | key
//!          | state | slack
//! state  = per plan field: tag byte, then a varint / 8 bytes / length + UTF-8
//! ```
//!
//! The record is allocated at an allocator size class (see [`size_class`]), so a
//! payload that grows by a digit usually still fits and an update writes in
//! place without allocating.
//!
//! Payloads are rendered lazily: an update that is not asked for its payload
//! (batch ingest) stores the new state and the length the payload will have
//! (computed without rendering, so `max_payload_bytes` is still checked before
//! anything is written), with bit 31 of `payload_len` set: not rendered yet.
//! The first poll of that version renders it from its copy of the record and
//! stores it back (if no update came meanwhile), so when updates outnumber
//! polls most of them are never rendered. An update asked for its payload
//! (single-message ingest answers with it) renders at once. Every reader gets
//! the payload of exactly the version it reports: both come from one copy of
//! one record.
//!
//! Beside each chunk's slots are their expiry stamps (one `AtomicU32` per
//! slot: the second, on the caller's clock, at which the box expires), so the
//! expiry sweep reads a shard's stamps in a row without touching any box.
//!
//! # Locking
//!
//! A poll takes no lock and performs no atomic read-modify-write on a line
//! another thread uses: it writes nothing shared at all (but for rendering a
//! payload left for later, once per version).
//!
//! - poll (and version, and the lookup of an update): pin the epoch
//!   (crossbeam-epoch: a store and a fence, or one compare-and-swap, on this
//!   thread's own line), load the shard's sequence and map, probe the index
//!   with relaxed/acquire loads, and for a slot whose fingerprint matches do a
//!   seqlock read: load the slot's sequence (even) and record pointer,
//!   compare the key and copy the payload with relaxed atomic loads, and keep
//!   the copy only if the sequence did not move (else copy again). A key found
//!   in a slot with a valid read is the answer: a box's record is in one slot
//!   at a time (moving it claims both slots). A key *not* found is the answer
//!   only if the shard's sequence was even and did not move meanwhile: a
//!   removal (which may move a box, shift index entries back, or shrink the
//!   map) makes it odd while it changes the index, so a lookup that raced one
//!   looks again. Inserts change no sequence: a new entry is stored into an
//!   empty bucket after its slot is filled, and a reader that misses it
//!   simply ran before it.
//! - Nothing a reader may hold is freed under it: a record replaced or
//!   removed, a chunk emptied, an index or directory replaced by a bigger or
//!   smaller one, is first unlinked and then retired to the epoch collector,
//!   which frees it once every thread pinned at that time has unpinned. This
//!   replaces the shard `RwLock` (one atomic read-modify-write pair per poll
//!   on the shard's line, and polls waiting behind a creation or removal) of
//!   the design before (BENCHMARKS §14).
//! - A poll waits only for the few dozen stores of a claim on the slot it
//!   reads (an update, a move), and, only when the key is absent, for the
//!   index stores of a removal in the same shard (a few dozen, never an
//!   allocation or a free). It never waits for a mutex.
//! - update of an existing box: the same lookup, then optimistically: copy the
//!   record (a seqlock read), check it is still this key's (a removal may
//!   have emptied the slot or moved another box into it: then look up again),
//!   build the next one from the copy, claim the slot's sequence with a
//!   compare-and-swap from the value read (fails if any writer stored
//!   meanwhile: start again), store the words (or, when the record needs
//!   another size class, swap in a new allocation and retire the old), store
//!   the expiry stamp when the second changed, release. Writers never wait
//!   for each other while computing, only for a claim's stores. An update
//!   never takes the shard's mutex.
//! - Structure (creating a box, removing one, the snapshot walk, restore,
//!   the floor) is changed under the shard's writer mutex, which only writers
//!   take: an insert fills the next slot (claimed) and then stores the index
//!   entry; a removal claims the slot, copies the record out, and then, with
//!   the shard's sequence odd, removes the entry (backward shift), moves the
//!   shard's last box into the hole (both slots claimed), and retires what it
//!   freed. An update racing a removal either claims first (and the removal
//!   copies the updated record) or fails its claim and finds the box gone.
//!   Expiry stamps are stored only under the slot's claim, so a removal
//!   deciding on the stamp (the sweep) and a move copying it see the last
//!   update's stamp.
//! - Locks are taken shard mutex first, slot claims second (a removal claims
//!   the hole before the last slot; no one else holds two claims).
//!
//! # Lifecycle (SPEC §3a)
//!
//! - Removal (`DELETE`, expiry) moves the shard's last slot into the hole, so
//!   slots `0..len` stay used; a chunk left empty is retired and a map left
//!   mostly empty shrinks, so the memory goes back (once the collector frees
//!   it: within a few epochs, which advance as threads pin).
//! - Expiry: each worker calls [`BoxTable::expire`] once a tick. A step claims
//!   the next slots of a table-wide cursor (shard by shard) and reads their
//!   stamps without locking; only when some are due does it take the shard's
//!   mutex, for at most [`REMOVE_PER_LOCK`] removals, each deciding on the
//!   stamp read again under the slot's claim. A step scans and removes at
//!   most its [`SweepBudget`], so no tick does more than a bounded amount of
//!   expiry work however many boxes expire at once. A pass through the table
//!   starts at most once a second (stamps count seconds): a table read
//!   through in less than a second costs nothing the rest of it.
//! - Incarnations: each shard keeps a version floor, the highest version a box
//!   removed from it served. A new box starts at the floor + 1, not at 1, so a
//!   key created again never serves a version (and so an ETag) an earlier
//!   incarnation served; a client holding an old ETag or `after` sees a newer
//!   version at once. The floor is saved in snapshots ([`BoxTable::version_floor`]).
//!
//! # Memory
//!
//! Per box: its record (header 16 + payload + key + state, rounded to a size
//! class: 96 to 112 bytes for the default config's 55 to 65-byte payloads; the
//! payload first, on a word, so readers copy it a word at a time), a 32-byte
//! slot and a 4-byte expiry stamp (56 of each in a 2 KiB chunk), and 8 bytes
//! of index per bucket (kept 3/8 to 3/4 full). [`BoxTable::accounted_bytes`]
//! adds these up with allocator size classes as they change; it matches
//! jemalloc's `stats.allocated` within 1%, once the collector has freed
//! what was retired.
//!
//! # Where things are
//!
//! This file is the table, its locking and the lifecycle. The rest, one job a
//! file: `reduce.rs` (the reducers: one message applied to a box's state),
//! `record.rs` (the byte layout of a record), `slot.rs` (the seqlock around a
//! record, its atomic word copies and the retiring of replaced records),
//! `codec.rs` (the compact field state encoding), `size.rs` (the allocator
//! size-class model the accounting uses).

pub(crate) mod codec;
mod record;
mod reduce;
mod size;
mod slot;

pub use size::size_class;

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};

use crate::config::Reduce;
use crate::plan::{MessageError, Plan, Value};
use crate::render::{render_fields, FieldState, FieldView};
use record::Payload;
use reduce::{next_record, with_scratch, Scratch};
use slot::{backoff, Slot, Words};

/// Number of shards. A power of two; 256 keeps writer-mutex contention low on
/// any core count we run on while costing 32 KiB.
pub const SHARDS: usize = 256;
/// The shard is taken from hash bits 40..48, outside the fingerprint (bits
/// 8..40), whose low bits choose the index bucket.
const SHARD_SHIFT: u32 = 40;
/// Slots per chunk: 56 slots (1,792 bytes) and their stamps (224 bytes) fill
/// a 2 KiB allocation; at most one chunk per shard is partly used.
const CHUNK: usize = 56;
/// Records [`BoxTable::for_each`] copies under one hold of a shard's mutex.
pub const WALK_BATCH: usize = 64;
/// The expiry stamp of a box that never expires (no `ttl_s`).
const NEVER: u32 = u32::MAX;
/// Boxes removed under one hold of a shard's mutex by the sweep: a creation
/// in that shard waits for at most this many removals (a few µs each).
pub const REMOVE_PER_LOCK: usize = 128;
/// The smallest index: 8 buckets.
const MIN_BUCKETS: usize = 8;

/// The sweep's cursor at the start of a pass: shard 0, from its end.
const SWEEP_START: u64 = u32::MAX as u64;

/// The keyed hash of box keys: foldhash's quality variant with a random
/// per-table seed (keys are chosen by clients, so the hash stays keyed: an
/// attacker who cannot see the seed cannot aim keys at one probe chain). About
/// 4x cheaper than std's SipHash-1-3 for short keys (BENCHMARKS §10).
type KeyHasher = foldhash::quality::RandomState;

/// Slots and their expiry stamps. Never moves while published; retired (not
/// freed) when emptied.
struct Chunk {
    slots: [Slot; CHUNK],
    /// Slot `i`'s stamp: the second (of the caller's clock) from which the
    /// box is due, [`NEVER`] without a ttl. Stored only under the slot's
    /// claim.
    expiry: [AtomicU32; CHUNK],
}

impl Chunk {
    fn new() -> Box<Chunk> {
        Box::new(Chunk {
            slots: std::array::from_fn(|_| Slot::default()),
            expiry: std::array::from_fn(|_| AtomicU32::new(NEVER)),
        })
    }
}

/// What readers of a shard find boxes through. Changed in place, entry by
/// entry, by the shard's writer; replaced whole (published new, the old one
/// retired) when the index or the directory must grow or shrink. Dropping a
/// map frees its two arrays, not the chunks (the shard owns those).
struct Map {
    /// Open addressing, linear probing from bucket `fingerprint & mask`; an
    /// entry is `fingerprint << 32 | (slot number + 1)`, 0 an empty bucket.
    /// A power of two long, at most 3/4 full.
    entries: Box<[AtomicU64]>,
    /// Chunk `c` holds slots `c * CHUNK..`; null past the chunks in use.
    chunks: Box<[AtomicPtr<Chunk>]>,
}

/// A slot and its expiry stamp, borrowed for as long as a guard is pinned.
#[derive(Clone, Copy)]
struct Place<'g> {
    /// The slot number.
    n: usize,
    slot: &'g Slot,
    stamp: &'g AtomicU32,
}

impl Map {
    fn new(buckets: usize, chunks: usize) -> Map {
        Map {
            entries: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            chunks: (0..chunks)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    /// Slot `n`, if its chunk is in this map.
    #[inline]
    fn place<'g>(&'g self, n: usize, _guard: &'g Guard) -> Option<Place<'g>> {
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
        })
    }

    /// The chunk pointers in use, and so owned by the shard.
    fn chunk_ptrs(&self) -> impl Iterator<Item = *mut Chunk> + '_ {
        self.chunks
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .filter(|c| !c.is_null())
    }

    /// Store `entry` in the first empty bucket of its probe sequence (the
    /// shard's writer; the map has room).
    fn insert_entry(&self, entry: u64) {
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
    fn bucket_of(&self, entry: u64) -> Option<usize> {
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
    fn remove_entry(&self, entry: u64) {
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
    fn rename_entry(&self, from: u64, to: u64) {
        if let Some(e) = self.bucket_of(from).and_then(|i| self.entries.get(i)) {
            e.store(to, Ordering::Release);
        }
    }

    /// A copy with `buckets` buckets and `chunks` directory entries (room for
    /// every entry and chunk in use), entries rehashed from their fingerprints.
    fn resized(&self, buckets: usize, chunks: usize) -> Map {
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
    fn bytes(&self) -> usize {
        size_class(std::mem::size_of::<Map>())
            + size_class(self.entries.len() * 8)
            + size_class(self.chunks.len() * std::mem::size_of::<AtomicPtr<Chunk>>())
    }
}

/// The index entry of the box in slot `n` whose key has fingerprint `fp`.
#[inline]
fn entry(fp: u32, n: usize) -> u64 {
    u64::from(fp) << 32 | (n as u64 + 1)
}

/// The smallest index (a power of two) that holds `n` entries at most 3/4
/// full.
fn buckets_for(n: usize) -> usize {
    (n * 4).div_ceil(3).next_power_of_two().max(MIN_BUCKETS)
}

/// What a poll reads: the sequence and the map, on a line of their own.
#[repr(align(64))]
struct ReadSide {
    /// Odd while a removal changes the index (a lookup that finds nothing
    /// meanwhile looks again); moved on only by the shard's writer.
    seq: AtomicU64,
    map: Atomic<Map>,
}

/// What only writers touch, on a line of its own, so a creation's stores do
/// not take the readers' line away from them.
#[repr(align(64))]
struct WriteSide {
    /// Held to change the shard's structure (create, remove, walk, restore).
    mutex: Mutex<()>,
    /// Slots `0..len` are used (written under the mutex).
    len: AtomicUsize,
    /// The highest version a box removed from this shard served: a new box
    /// starts past it (raised under the mutex).
    floor: AtomicU64,
    /// Heap bytes of this shard: map, chunks, records.
    bytes: AtomicUsize,
}

struct Shard {
    read: ReadSide,
    write: WriteSide,
}

/// The shard's sequence made odd for the time of a restructuring, even again
/// when dropped (the shard's writer only: plain stores).
struct Restructuring<'a> {
    seq: &'a AtomicU64,
    was: u64,
}

impl Shard {
    fn new() -> Shard {
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
            },
        }
    }

    #[inline]
    fn map<'g>(&self, guard: &'g Guard) -> Option<&'g Map> {
        let map = self.read.map.load(Ordering::Acquire, guard);
        // SAFETY: maps are published fully built (release, paired with the
        // acquire above) and freed only through `defer_destroy` after being
        // replaced, so one loaded while pinned stays allocated while `guard`
        // is.
        unsafe { map.as_ref() }
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
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
    fn restructure(&self) -> Restructuring<'_> {
        let seq = &self.read.seq;
        let was = seq.load(Ordering::Relaxed);
        seq.store(was + 1, Ordering::Relaxed);
        // Readers that see any store of the restructuring see the odd value
        // when they check the sequence again.
        fence(Ordering::Release);
        Restructuring { seq, was }
    }

    fn add_bytes(&self, was: usize, is: usize) {
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

/// Every box, shared by all workers (`Arc<BoxTable>`).
pub struct BoxTable {
    plan: Arc<Plan>,
    /// [`reduce::field_heads`] of the plan.
    heads: Box<[Box<[u8]>]>,
    hasher: KeyHasher,
    shards: Box<[Shard]>,
    /// Boxes created; never above `plan.max_boxes` (reserved under the shard
    /// mutex with a compare-and-swap, after the key is known to be new).
    boxes: AtomicUsize,
    /// Where the expiry sweep goes on: `shard << 32 | slot`; each shard is read
    /// from its end down, so the slots below `slot` are still to be read
    /// (`u32::MAX`: the whole shard).
    sweep: AtomicU64,
    /// The first second in which the next pass of the sweep may start: one
    /// pass a second at most (stamps count whole seconds, so a second pass in
    /// the same second would find nothing new).
    next_pass: AtomicU32,
}
/// The epoch held pinned on this thread for a batch of table operations (a
/// worker's ready events of one turn): each poll inside pins again, which
/// then costs a counter instead of the pin's fence (BENCHMARKS §14). Never
/// hold one across a wait: memory retired meanwhile is freed only after it
/// is dropped.
pub struct ReadBatch {
    _pinned: Guard,
}

/// Pin the epoch for a batch of operations (see [`ReadBatch`]).
pub fn read_batch() -> ReadBatch {
    ReadBatch {
        _pinned: epoch::pin(),
    }
}

/// How much one [`BoxTable::expire`] step may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBudget {
    /// Expiry stamps read.
    pub scan: usize,
    /// Boxes removed.
    pub remove: usize,
}

impl SweepBudget {
    /// One worker's step per tick: 16,384 stamps read (about 0.1 ms) and at
    /// most 1,024 boxes removed (about 0.2 ms), so with 2 workers and 16 ms
    /// ticks a table of a million boxes is read through in half a second (once
    /// a second at most) and up to 128,000 boxes a second are removed.
    pub const PER_TICK: SweepBudget = SweepBudget {
        scan: 16_384,
        remove: 1_024,
    };
}

/// What one [`BoxTable::expire`] step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub scanned: usize,
    pub removed: usize,
}

/// A box taken out of the table (expired): a copy of its record, freed when
/// dropped.
pub struct Removed(Vec<u8>);

impl Removed {
    pub fn key(&self) -> &[u8] {
        record::key(&self.0)
    }

    /// The last version it served.
    pub fn version(&self) -> u64 {
        record::version(&self.0)
    }
}

/// Why [`BoxTable::restore`] refused a box (a snapshot that does not fit the
/// current configuration).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RestoreError {
    #[error("empty key")]
    EmptyKey,
    #[error("key longer than max_key_bytes ({max})")]
    KeyTooLong { max: usize },
    #[error("version 0 (versions start at 1)")]
    ZeroVersion,
    #[error("{found} field states for {expected} configured fields")]
    FieldCount { expected: usize, found: usize },
    #[error("field {field}: stored state does not fit its configured type")]
    WrongType { field: String },
    #[error("payload over max_payload_bytes ({max})")]
    PayloadTooLarge { max: usize },
    #[error("more boxes than max_boxes ({max})")]
    TooManyBoxes { max: usize },
    #[error("the box is already present")]
    Duplicate,
}

/// The 32 bits of a key's hash kept in the index to tell boxes apart without
/// reading them (bits 8..40: not the shard bits); its low bits choose the
/// bucket, so an entry can be moved to a resized index without its key.
#[inline]
fn fingerprint(hash: u64) -> u32 {
    (hash >> 8) as u32
}

/// The caller's clock in whole seconds, as expiry stamps count (below [`NEVER`]).
#[inline]
fn second(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).map_or(NEVER - 1, |s| s.min(NEVER - 1))
}

/// What a read of a slot found for the key looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// The box's version (its payload copied, when asked for).
    At(u64),
    /// The payload was asked for and is not rendered yet: render it from a
    /// whole copy of the record.
    Unrendered,
}

/// Read `slot` if it holds `key`: its version, and with `out` its payload
/// appended to `out`. `None` for a slot of another key or none. Never blocks a
/// writer nor writes anything; retries while a writer stores (a few dozen
/// stores).
#[inline(always)]
fn look(slot: &Slot, guard: &Guard, key: &[u8], mut out: Option<&mut Vec<u8>>) -> Option<Seen> {
    loop {
        let r = slot.begin(guard);
        let head = r.head();
        let (key_len, payload_len) = (record::key_len(&head), record::payload_len(&head));
        let mark = out.as_ref().map_or(0, |o| o.len());
        let seen = if key_len != key.len() || !r.eq_at(record::key_at(payload_len), key) {
            None
        } else {
            match out.as_deref_mut() {
                None => Some(Seen::At(record::version(&head))),
                Some(_) if !record::rendered(&head) => Some(Seen::Unrendered),
                Some(o) => r
                    .copy_to(record::HEADER, payload_len, o)
                    .then(|| Seen::At(record::version(&head))),
            }
        };
        if r.valid() {
            return seen;
        }
        if let Some(o) = out.as_deref_mut() {
            o.truncate(mark);
        }
    }
}

/// An accepted message moved a box's expiry (under its slot's claim). Stored
/// only when the second changed, so updates of neighbouring boxes on several
/// workers do not keep writing one cache line.
#[inline]
fn touch(stamp: &AtomicU32, expires: u32) {
    if stamp.load(Ordering::Relaxed) != expires {
        stamp.store(expires, Ordering::Relaxed);
    }
}

/// The first `used` bytes of a record image, rounded up to whole words (an
/// image is always whole words: its size class).
fn whole_words(image: &[u8], used: usize) -> &[u8] {
    &image[..used.next_multiple_of(8).min(image.len())]
}

/// The size class a record of `key`, `state` and a payload of `payload_len`
/// bytes moves to from a record of `now` bytes, `None` to stay. It grows when
/// it does not fit; it shrinks only when a class half the size would do, so a
/// payload wavering around a class edge does not reallocate on every message.
fn resize(key: &str, state: &[u8], payload_len: usize, now: usize) -> Option<usize> {
    let need = record::size(key, state, payload_len);
    let class = size_class(need);
    (need > now || class <= now / 2).then_some(class)
}

/// A new record's words (built in `image`, a scratch buffer, so the words are
/// the only allocation).
fn new_words(image: &mut Vec<u8>, version: u64, key: &str, state: &[u8], p: Payload<'_>) -> Words {
    image.clear();
    image.resize(size_class(record::size(key, state, p.len())), 0);
    record::write(image, version, key, state, p);
    Words::new(image)
}

/// Bytes of a chunk's allocation.
fn chunk_bytes() -> usize {
    size_class(std::mem::size_of::<Chunk>())
}

impl BoxTable {
    pub fn new(plan: Arc<Plan>) -> BoxTable {
        BoxTable {
            heads: reduce::field_heads(&plan),
            plan,
            hasher: KeyHasher::default(),
            shards: (0..SHARDS).map(|_| Shard::new()).collect(),
            boxes: AtomicUsize::new(0),
            sweep: AtomicU64::new(SWEEP_START),
            next_pass: AtomicU32::new(0),
        }
    }

    /// A table that hashes keys as `other` does (tests that compare two
    /// tables' layouts, which another seed would spread over other shards).
    #[cfg(test)]
    fn with_hasher_of(plan: Arc<Plan>, other: &BoxTable) -> BoxTable {
        BoxTable {
            hasher: other.hasher.clone(),
            ..BoxTable::new(plan)
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The expiry stamp of a box that accepts a message at `now_ms`: due once
    /// the clock's second passes `ttl_s` whole seconds after this one, so a box
    /// is due between `ttl_s` and `ttl_s + 1` seconds after its last message
    /// (and removed by the next pass of the sweep, which starts once a second).
    fn expires_at(&self, now_ms: u64) -> u32 {
        match self.plan.ttl_s {
            0 => NEVER,
            ttl => second(now_ms)
                .saturating_add(ttl)
                .saturating_add(1)
                .min(NEVER - 1),
        }
    }

    /// Apply one message that the projection accepted at `now_ms` (the
    /// caller's monotonic clock, which expiry counts on): `values` holds one
    /// entry per plan field (`None`: absent, the field keeps its state; a
    /// `count` field counts anyway). Reducers and the payload's length are
    /// checked before anything is written, so a rejected message changes
    /// nothing. A new box starts at version 1, or past every version a removed
    /// box of its shard served. If `out` is given, the new payload is rendered
    /// and appended to it; otherwise it is rendered by the first read that
    /// wants it (lazy rendering: updates that no poll sees are never
    /// rendered). Returns the box's new version.
    pub fn apply(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        now_ms: u64,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        self.check_key(key)?;
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let expires = self.expires_at(now_ms);
        let guard = epoch::pin();
        loop {
            let found = self.find(shard, hash, &guard, |p| {
                look(p.slot, &guard, key.as_bytes(), None).map(|_| p)
            });
            let done = match found {
                Some(place) => self.update(
                    shard,
                    place,
                    key,
                    values,
                    expires,
                    out.as_deref_mut(),
                    &guard,
                )?,
                None => self.create(
                    shard,
                    hash,
                    key,
                    values,
                    expires,
                    out.as_deref_mut(),
                    &guard,
                )?,
            };
            if let Some(version) = done {
                return Ok(version);
            }
            // Removed or moved since it was found, or created by another
            // writer since it was missed: look again.
        }
    }

    /// Append the payload of `key` to `out` and return its version; `None` (and
    /// `out` untouched) for an unknown key. Allocates nothing when `out` has
    /// room (after this thread's first render of a payload left for later).
    /// Takes no lock and writes nothing shared, except when it renders a
    /// payload left for later (once per version) and stores it in the record.
    pub fn poll(&self, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let guard = epoch::pin();
        loop {
            let (place, seen) = self.find(shard, hash, &guard, |p| {
                look(p.slot, &guard, key, Some(&mut *out)).map(|seen| (p, seen))
            })?;
            match seen {
                Seen::At(version) => return Some(version),
                Seen::Unrendered => {
                    if let Some(version) = self.render_later(place.slot, key, out, &guard) {
                        return Some(version);
                    }
                }
            }
        }
    }

    /// The version of `key`, or `None` if unknown (for long-polls and ETags).
    pub fn version(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let guard = epoch::pin();
        match self.find(self.shard(hash), hash, &guard, |p| {
            look(p.slot, &guard, key, None)
        })? {
            Seen::At(version) => Some(version),
            Seen::Unrendered => None,
        }
    }

    /// Remove the box of `key` now (`DELETE`); returns the last version it
    /// served, `None` for an unknown key. Its memory is retired to the epoch
    /// collector, which frees it once no reader can hold it.
    pub fn remove(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let guard = epoch::pin();
        let _writer = shard.lock();
        let n = self.find(shard, hash, &guard, |p| {
            look(p.slot, &guard, key, None).map(|_| p.n)
        })?;
        let removed = self.remove_slot(shard, n, None, &guard)?;
        Some(record::version(&removed))
    }

    /// One step of the expiry sweep at `now_ms`: go on from where the last step
    /// (of any worker) stopped, read at most `budget.scan` expiry stamps and
    /// remove at most `budget.remove` boxes that are due, pushing them to
    /// `removed` (the caller wakes their long-polls, then drops them, which
    /// frees them outside every lock). Nothing to remove without `ttl_s`.
    ///
    /// The first few calls (once a tick per worker) after this thread retired
    /// something (a removed box, an emptied chunk, a replaced map) also
    /// let the epoch collector go on: the thread's retired memory goes to the
    /// global queue, and what no pinned thread can hold any more is freed. So
    /// the memory of removed boxes goes back within a few ticks even on a
    /// server that does nothing else (collection otherwise runs every 128
    /// pins).
    pub fn expire(&self, now_ms: u64, budget: SweepBudget, removed: &mut Vec<Removed>) -> Swept {
        slot::flush_owed();
        let mut done = Swept::default();
        if self.plan.ttl_s == 0 || self.is_empty() {
            return done;
        }
        let now = second(now_ms);
        // A step goes at most once around the table, however small it is.
        let mut claims = 0;
        while done.scanned < budget.scan && done.removed < budget.remove && claims < SHARDS {
            let pos = self.sweep.load(Ordering::Acquire);
            if pos == SWEEP_START && now < self.next_pass.load(Ordering::Acquire) {
                // This second's pass is done.
                break;
            }
            let s = (pos >> 32) as usize % SHARDS;
            let shard = &self.shards[s];
            let room = (budget.remove - done.removed).min(REMOVE_PER_LOCK);
            // Each shard is read from its end down: a removal moves the shard's
            // last box, which this pass has read already, into the hole, so no
            // box the pass has yet to read ever moves. Stamps are read without
            // a lock; the claim stops early once the boxes due are as many as
            // one hold of the mutex may remove.
            let (lo, hi, due, next) = {
                let guard = epoch::pin();
                let map = shard.map(&guard);
                let stamp = |i: usize| {
                    map.and_then(|m| m.place(i, &guard))
                        .map_or(NEVER, |p| p.stamp.load(Ordering::Relaxed))
                };
                let hi = (pos as u32 as usize).min(shard.write.len.load(Ordering::Acquire));
                let mut lo = hi;
                let mut due = 0;
                while lo > 0 && hi - lo < budget.scan - done.scanned && due < room {
                    lo -= 1;
                    if stamp(lo) <= now {
                        due += 1;
                    }
                }
                let next = if lo == 0 {
                    (((s + 1) % SHARDS) as u64) << 32 | u64::from(u32::MAX)
                } else {
                    (s as u64) << 32 | lo as u64
                };
                (lo, hi, due, next)
            };
            // Claim the slots read; another worker that moved the cursor first
            // has claimed them (or others) itself: read on from where it is.
            if self
                .sweep
                .compare_exchange(pos, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if pos == SWEEP_START {
                self.next_pass
                    .fetch_max(now.saturating_add(1), Ordering::AcqRel);
            }
            claims += 1;
            done.scanned += hi - lo;
            if due == 0 {
                continue;
            }
            let guard = epoch::pin();
            let _writer = shard.lock();
            let mut taken = 0;
            for i in (lo..hi.min(shard.write.len.load(Ordering::Relaxed))).rev() {
                if taken == room {
                    break;
                }
                let stamp = shard.map(&guard).and_then(|m| m.place(i, &guard));
                if stamp.is_none_or(|p| p.stamp.load(Ordering::Relaxed) > now) {
                    continue;
                }
                // The stamp is read again under the slot's claim: an update
                // may have moved it since.
                if let Some(record) = self.remove_slot(shard, i, Some(now), &guard) {
                    removed.push(Removed(record));
                    taken += 1;
                }
            }
            done.removed += taken;
        }
        done
    }

    /// Whether keys `a` and `b` are in one shard (for benches that make
    /// writers and readers meet in a shard).
    #[doc(hidden)]
    pub fn same_shard(&self, a: &[u8], b: &[u8]) -> bool {
        std::ptr::eq(
            self.shard(self.hasher.hash_one(a)),
            self.shard(self.hasher.hash_one(b)),
        )
    }

    /// Number of boxes.
    pub fn len(&self) -> usize {
        self.boxes.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the table, counted at allocator size classes: the
    /// shard array, every shard's map (index and directory), chunks, and every
    /// record. Updated as boxes are created, removed and records reallocated
    /// (what was retired is no longer counted, though the collector may free
    /// it a little later).
    pub fn accounted_bytes(&self) -> usize {
        let fixed = size_class(self.shards.len() * std::mem::size_of::<Shard>());
        fixed
            + self
                .shards
                .iter()
                .map(|s| s.write.bytes.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// The highest version any removed box served (0 if none was removed): a
    /// table restored from a snapshot gets it back with
    /// [`BoxTable::raise_version_floor`], so incarnations stay apart across a
    /// restart.
    pub fn version_floor(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.write.floor.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// New boxes start past `floor` from now on (in every shard: a restarted
    /// process hashes keys to other shards).
    pub fn raise_version_floor(&self, floor: u64) {
        for s in self.shards.iter() {
            let _writer = s.lock();
            s.write.floor.fetch_max(floor, Ordering::AcqRel);
        }
    }

    /// Call `f(key, version, idle_s, state)` for every box (snapshots):
    /// `idle_s` is how long, at `now_ms`, the box has accepted no message (0
    /// without a ttl, where it is not kept). Each box is seen whole (a seqlock
    /// read of its record), but boxes created, updated or removed during the
    /// walk may or may not be seen.
    ///
    /// `f` runs with no lock held: the records of up to [`WALK_BATCH`] slots are
    /// copied under the shard's mutex, which is let go, and only then are
    /// they decoded and handed to `f` (which writes a file). The mutex is so
    /// held for the time of a few small copies, never for a write; polls and
    /// updates never wait for it.
    pub fn for_each(&self, now_ms: u64, mut f: impl FnMut(&str, u64, u32, &[FieldState])) {
        let n = self.plan.fields.len();
        let mut states: Vec<FieldState> = Vec::with_capacity(n);
        let mut key = String::new();
        let fresh = self.expires_at(now_ms);
        let mut copied: Vec<u8> = Vec::with_capacity(WALK_BATCH * 128);
        // Per copied record: where it ends in `copied`, and its idle seconds.
        let mut ends: Vec<(usize, u32)> = Vec::with_capacity(WALK_BATCH);
        for shard in self.shards.iter() {
            let mut next = 0usize;
            loop {
                copied.clear();
                ends.clear();
                {
                    let guard = epoch::pin();
                    let _writer = shard.lock();
                    let len = shard.write.len.load(Ordering::Relaxed);
                    let stop = len.min(next + WALK_BATCH);
                    let map = shard.map(&guard);
                    for i in next..stop {
                        let Some(place) = map.and_then(|m| m.place(i, &guard)) else {
                            continue;
                        };
                        loop {
                            let r = place.slot.begin(&guard);
                            let mark = copied.len();
                            r.copy_to(0, r.bytes(), &mut copied);
                            if r.valid() {
                                break;
                            }
                            copied.truncate(mark);
                        }
                        let idle = match place.stamp.load(Ordering::Relaxed) {
                            NEVER => 0,
                            at => fresh.saturating_sub(at),
                        };
                        ends.push((copied.len(), idle));
                    }
                    next = stop;
                    if ends.is_empty() && stop == len {
                        break;
                    }
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
            }
        }
    }

    /// Insert a box as a snapshot recorded it at `now_ms`: `state` has one
    /// entry per plan field, `idle_s` is how long it had accepted no message
    /// (its ttl runs on from there). The payload is rendered again (so a changed
    /// field name or order cannot leave stale payloads); a key already present
    /// is refused.
    pub fn restore(
        &self,
        key: &str,
        version: u64,
        idle_s: u32,
        state: &[FieldState],
        now_ms: u64,
    ) -> Result<(), RestoreError> {
        self.check_key(key).map_err(|e| match e {
            MessageError::EmptyKey => RestoreError::EmptyKey,
            _ => RestoreError::KeyTooLong {
                max: self.plan.max_key_bytes,
            },
        })?;
        if version == 0 {
            return Err(RestoreError::ZeroVersion);
        }
        let fields = &self.plan.fields;
        if state.len() != fields.len() {
            return Err(RestoreError::FieldCount {
                expected: fields.len(),
                found: state.len(),
            });
        }
        for (f, s) in fields.iter().zip(state) {
            if !s.fits(f.ty, f.reduce == Reduce::Count) {
                return Err(RestoreError::WrongType {
                    field: f.name.clone(),
                });
            }
        }
        let words = with_scratch(|scratch| {
            scratch.clear();
            for s in state {
                codec::encode(s.view(), &mut scratch.state);
            }
            let Scratch {
                state: st,
                payload,
                image,
            } = scratch;
            render_fields(&self.plan, key, version, codec::Decoder::new(st), payload);
            if payload.len() > self.plan.max_payload_bytes {
                return Err(RestoreError::PayloadTooLarge {
                    max: self.plan.max_payload_bytes,
                });
            }
            Ok(new_words(
                image,
                version,
                key,
                st,
                Payload::Rendered(payload),
            ))
        })?;
        let expires = match self.expires_at(now_ms) {
            NEVER => NEVER,
            fresh => fresh.saturating_sub(idle_s).max(second(now_ms)),
        };
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let guard = epoch::pin();
        let _writer = shard.lock();
        if self
            .find(shard, hash, &guard, |p| {
                look(p.slot, &guard, key.as_bytes(), None)
            })
            .is_some()
        {
            return Err(RestoreError::Duplicate);
        }
        self.reserve_box().map_err(|_| RestoreError::TooManyBoxes {
            max: self.plan.max_boxes,
        })?;
        self.insert(shard, hash, words, expires, &guard);
        Ok(())
    }

    /// Size a scratch record image once per thread for the largest record the
    /// plan allows (header, key, payload, state), so that reading a record and
    /// building the next one never allocates on the steady path, not even when
    /// a record moves to a larger size class (then only its words are new).
    fn reserve_image(&self, image: &mut Vec<u8>) {
        let plan = &self.plan;
        let state = plan.max_payload_bytes + 16 * plan.fields.len();
        let key = plan.max_key_bytes.min(record::MAX_KEY);
        image.reserve(size_class(
            record::HEADER + key + plan.max_payload_bytes + state,
        ));
    }

    fn check_key(&self, key: &str) -> Result<(), MessageError> {
        if key.is_empty() {
            Err(MessageError::EmptyKey)
        } else if key.len() > self.plan.max_key_bytes || key.len() > record::MAX_KEY {
            Err(MessageError::KeyTooLong)
        } else {
            Ok(())
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize & (SHARDS - 1)]
    }

    /// Look `hash` up in `shard` without locking: `visit` is called on each
    /// slot whose fingerprint matches and says `None` for a slot holding
    /// another key (or none). A miss is returned only if no removal changed
    /// the shard's index meanwhile (else the lookup starts again).
    #[inline]
    fn find<'g, R>(
        &self,
        shard: &Shard,
        hash: u64,
        guard: &'g Guard,
        mut visit: impl FnMut(Place<'g>) -> Option<R>,
    ) -> Option<R> {
        let fp = fingerprint(hash);
        let mut spins = 0;
        loop {
            let seq = shard.read.seq.load(Ordering::Acquire);
            if let Some(map) = shard.map(guard) {
                let mask = map.entries.len().wrapping_sub(1);
                let mut i = fp as usize & mask;
                for _ in 0..map.entries.len() {
                    let Some(e) = map.entries.get(i) else {
                        break;
                    };
                    // Acquire: the slot an entry names was filled before it.
                    let e = e.load(Ordering::Acquire);
                    if e == 0 {
                        break;
                    }
                    if (e >> 32) as u32 == fp {
                        let n = (e as u32 as usize).wrapping_sub(1);
                        if let Some(r) = map.place(n, guard).and_then(&mut visit) {
                            return Some(r);
                        }
                    }
                    i = (i + 1) & mask;
                }
            }
            fence(Ordering::Acquire);
            if seq & 1 == 0 && shard.read.seq.load(Ordering::Relaxed) == seq {
                return None;
            }
            backoff(&mut spins);
        }
    }

    /// Apply to an existing box, found at `place`, shared with readers and
    /// other writers: read the record, build the next one from that copy, and
    /// store it if nothing was stored meanwhile (else start again from a fresh
    /// copy); a record that needs another size class is swapped for a new
    /// allocation under the same claim. `Ok(None)` when the slot no longer
    /// holds the box (removed, or another box moved in): look it up again.
    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        shard: &Shard,
        place: Place<'_>,
        key: &str,
        values: &[Option<Value<'_>>],
        expires: u32,
        out: Option<&mut Vec<u8>>,
        guard: &Guard,
    ) -> Result<Option<u64>, MessageError> {
        with_scratch(|scratch| {
            let Scratch {
                state,
                payload,
                image,
            } = scratch;
            self.reserve_image(image);
            loop {
                let r = place.slot.begin(guard);
                r.load(image);
                if !r.valid() {
                    continue;
                }
                if r.is_empty() || !record::key_is(image, key.as_bytes()) {
                    return Ok(None);
                }
                let (version, len) =
                    self.next_of(image, key, values, state, payload, out.is_some())?;
                let next = Payload::of(out.is_some(), payload, len);
                let old = image.len();
                match resize(key, state, len, old) {
                    None => {
                        let used = record::rewrite(image, version, key, state, next);
                        let Some(claim) = r.claim() else {
                            continue;
                        };
                        claim.store(whole_words(image, used));
                        touch(place.stamp, expires);
                    }
                    Some(class) => {
                        let words = new_words(image, version, key, state, next);
                        let Some(mut claim) = r.claim() else {
                            continue;
                        };
                        claim.replace(words, guard);
                        touch(place.stamp, expires);
                        drop(claim);
                        shard.add_bytes(old, class);
                    }
                }
                if let Some(out) = out {
                    out.extend_from_slice(payload);
                }
                return Ok(Some(version));
            }
        })
    }

    /// The message applied to the box whose record is in `image`: its next
    /// version and payload length, the next state in `state` and, when
    /// `render`, the payload in `payload`.
    fn next_of(
        &self,
        image: &[u8],
        key: &str,
        values: &[Option<Value<'_>>],
        state: &mut Vec<u8>,
        payload: &mut Vec<u8>,
        render: bool,
    ) -> Result<(u64, usize), MessageError> {
        next_record(
            &self.plan,
            &self.heads,
            key,
            record::state(image),
            record::version(image),
            values,
            state,
            payload,
            render,
        )
    }

    /// A poll found the payload of `key` left for later: render it into `out`
    /// from a whole copy of the record, and store it in the record so the
    /// next polls copy it (unless a writer stored meanwhile: then this version
    /// is no longer the newest and is not kept). Returns the version rendered,
    /// `None` when the slot no longer holds the box (look it up again).
    #[cold]
    fn render_later(
        &self,
        slot: &Slot,
        key: &[u8],
        out: &mut Vec<u8>,
        guard: &Guard,
    ) -> Option<u64> {
        with_scratch(|scratch| {
            let image = &mut scratch.image;
            self.reserve_image(image);
            loop {
                let r = slot.begin(guard);
                r.load(image);
                if !r.valid() {
                    continue;
                }
                if r.is_empty() || record::key(image) != key {
                    return None;
                }
                let version = record::version(image);
                if record::rendered(image) {
                    out.extend_from_slice(record::payload(image));
                    return Some(version);
                }
                let start = out.len();
                // Keys are stored from a `&str`.
                let key = std::str::from_utf8(record::key(image)).unwrap_or_default();
                let state = codec::Decoder::new(record::state(image));
                render_fields(&self.plan, key, version, state, out);
                let rendered = out.get(start..).unwrap_or_default();
                if record::set_rendered(image, rendered) {
                    if let Some(claim) = r.claim() {
                        let used = record::HEADER + rendered.len();
                        claim.store(whole_words(image, used));
                    }
                }
                return Some(version);
            }
        })
    }

    /// Create `key`, missed by a lookup: build the new box outside the mutex
    /// (past the shard's floor), then insert it unless another writer created
    /// the key meanwhile (`Ok(None)`: the caller applies to that box). Should
    /// a box of the shard have been removed meanwhile, the floor moved and the
    /// box is built again past it (rare).
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        shard: &Shard,
        hash: u64,
        key: &str,
        values: &[Option<Value<'_>>],
        expires: u32,
        out: Option<&mut Vec<u8>>,
        guard: &Guard,
    ) -> Result<Option<u64>, MessageError> {
        let render = out.is_some();
        let build = |floor: u64| {
            with_scratch(|scratch| {
                let Scratch {
                    state,
                    payload,
                    image,
                } = scratch;
                self.reserve_image(image);
                let (version, len) = next_record(
                    &self.plan,
                    &self.heads,
                    key,
                    &[],
                    floor,
                    values,
                    state,
                    payload,
                    render,
                )?;
                let next = Payload::of(render, payload, len);
                Ok::<_, MessageError>((version, len, new_words(image, version, key, state, next)))
            })
        };
        let floor = shard.write.floor.load(Ordering::Acquire);
        let (mut version, mut len, mut words) = build(floor)?;
        let _writer = shard.lock();
        if self
            .find(shard, hash, guard, |p| {
                look(p.slot, guard, key.as_bytes(), None)
            })
            .is_some()
        {
            return Ok(None);
        }
        let now = shard.write.floor.load(Ordering::Relaxed);
        if now != floor {
            (version, len, words) = build(now)?;
        }
        self.reserve_box()?;
        if let Some(out) = out {
            // Rendered into the record, which no one else sees yet.
            words.copy_to(record::HEADER, len, out);
        }
        self.insert(shard, hash, words, expires, guard);
        Ok(Some(version))
    }

    /// Count one more box, unless that would pass `max_boxes`.
    fn reserve_box(&self) -> Result<(), MessageError> {
        let max = self.plan.max_boxes;
        self.boxes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| MessageError::TooManyBoxes)
    }

    /// Put a counted, new box in the shard's next slot and index it (the
    /// shard's mutex held): the slot is filled first, then the entry stored,
    /// so a reader that finds the entry finds the box.
    fn insert(&self, shard: &Shard, hash: u64, words: Words, expires: u32, guard: &Guard) {
        // Shards hold far fewer than 2^32 boxes: max_boxes is a usize, but the
        // index spreads boxes over 256 shards and 2^32 records would not fit
        // in memory anyway.
        let n = shard.write.len.load(Ordering::Relaxed);
        let mut added = words.bytes();
        let map = self.map_with_room(shard, n + 1, guard);
        let Some(dir) = map.chunks.get(n / CHUNK) else {
            return;
        };
        if dir.load(Ordering::Relaxed).is_null() {
            // Release: a reader that loads the pointer sees the chunk built.
            dir.store(Box::into_raw(Chunk::new()), Ordering::Release);
            added += chunk_bytes();
        }
        let Some(place) = map.place(n, guard) else {
            return;
        };
        {
            let mut claim = place.slot.claim_now(guard);
            debug_assert!(claim.is_empty());
            claim.replace(words, guard);
            place.stamp.store(expires, Ordering::Relaxed);
        }
        map.insert_entry(entry(fingerprint(hash), n));
        shard.write.len.store(n + 1, Ordering::Release);
        shard.write.bytes.fetch_add(added, Ordering::Relaxed);
    }

    /// The shard's map, replaced by a bigger one first if it has no room for
    /// `len` boxes (index at most 3/4 full, a chunk for each); doubling, so
    /// inserts copy each entry a constant number of times on average.
    fn map_with_room<'g>(&self, shard: &Shard, len: usize, guard: &'g Guard) -> &'g Map {
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
    fn republish<'g>(
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
    /// slot's claim) is due at that second. The shard's last box moves into
    /// the hole so slots `0..len` stay used; an emptied chunk is retired, a
    /// mostly empty map shrinks, the floor rises to the box's version.
    fn remove_slot(
        &self,
        shard: &Shard,
        n: usize,
        due: Option<u32>,
        guard: &Guard,
    ) -> Option<Vec<u8>> {
        let last = shard.write.len.load(Ordering::Relaxed).checked_sub(1)?;
        if n > last {
            return None;
        }
        let map = shard.map(guard)?;
        let hole = map.place(n, guard)?;
        let from = map.place(last, guard)?;
        let mut claim = hole.slot.claim_now(guard);
        if claim.is_empty() || due.is_some_and(|now| hole.stamp.load(Ordering::Relaxed) > now) {
            return None;
        }
        let mut record = Vec::new();
        claim.load(&mut record);
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
                    fingerprint(self.hasher.hash_one(record::key(&s.image)))
                });
                claim.move_from(&mut moved);
                hole.stamp
                    .store(from.stamp.load(Ordering::Relaxed), Ordering::Relaxed);
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
    fn shrink(&self, shard: &Shard, len: usize, guard: &Guard) {
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
struct RetiredChunk(*mut Chunk);

impl fmt::Debug for BoxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxTable")
            .field("boxes", &self.len())
            .field("accounted_bytes", &self.accounted_bytes())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldType;
    use crate::plan::FieldPlan;
    use std::sync::Barrier;

    pub(super) fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
        FieldPlan {
            name: name.into(),
            path: if reduce == Reduce::Count {
                vec![]
            } else {
                vec![name.into()]
            },
            ty,
            reduce,
            max_len: if ty == FieldType::Str { 16 } else { 0 },
        }
    }

    pub(super) fn table_with(fields: Vec<FieldPlan>) -> BoxTable {
        BoxTable::new(Arc::new(Plan {
            key_field: "key".into(),
            max_key_bytes: 16,
            max_payload_bytes: 256,
            max_boxes: 1000,
            ttl_s: 0,
            fields,
        }))
    }

    pub(super) fn payload(t: &BoxTable, key: &str) -> String {
        let mut out = Vec::new();
        t.poll(key.as_bytes(), &mut out).expect("box exists");
        String::from_utf8(out).expect("UTF-8 payload")
    }

    pub(super) fn apply(
        t: &BoxTable,
        key: &str,
        values: &[Option<Value<'_>>],
    ) -> Result<u64, MessageError> {
        t.apply(key, values, 0, None)
    }

    pub(super) fn i(v: i64) -> Option<Value<'static>> {
        Some(Value::I64(v))
    }

    pub(super) fn f(v: f64) -> Option<Value<'static>> {
        Some(Value::F64(v))
    }

    #[test]
    fn for_each_calls_back_with_no_lock_held() {
        // The callback creates boxes (shard write locks) in every shard: were it
        // called under a shard's read lock, the thread would deadlock on itself.
        let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
        for k in 0..3 * WALK_BATCH * SHARDS / 64 {
            apply(&t, &format!("seed-{k}"), &[i(1), i(1), None, None]).unwrap();
        }
        let (done, finished) = std::sync::mpsc::channel();
        let walker = t.clone();
        std::thread::spawn(move || {
            let mut seen = 0;
            let mut created = 0;
            walker.for_each(0, |key, version, _, _| {
                assert!(key.starts_with("seed-") || key.starts_with("new-"));
                assert!(version >= 1);
                seen += 1;
                if created < 1000 {
                    let k = format!("new-{created}");
                    created += 1;
                    apply(&walker, &k, &[i(1), i(1), None, None]).unwrap();
                }
            });
            let _ = done.send(seen);
        });
        let seen = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("for_each deadlocked: its callback ran under a shard lock");
        assert!(
            seen >= 3 * WALK_BATCH * SHARDS / 64,
            "every seeded box is seen"
        );
    }

    #[test]
    fn spec_example() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        assert_eq!(
            apply(&t, "box-42", &[i(7), i(7), None, Some(Value::Str("p-1"))]),
            Ok(1)
        );
        let mut out = b"prefix:".to_vec();
        let v = t.apply(
            "box-42",
            &[i(5), i(5), None, Some(Value::Str("p-7"))],
            0,
            Some(&mut out),
        );
        assert_eq!(v, Ok(2));
        let expected = r#"{"k":"box-42","ver":2,"v":5,"sum":12,"n":2,"by":"p-7"}"#;
        assert_eq!(out, [b"prefix:".as_slice(), expected.as_bytes()].concat());
        assert_eq!(payload(&t, "box-42"), expected);
        assert_eq!(t.version(b"box-42"), Some(2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn new_box_starts_at_version_one_and_renders_on_create() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let mut out = Vec::new();
        assert_eq!(
            t.apply("a", &[None, None, None, None], 0, Some(&mut out)),
            Ok(1)
        );
        assert_eq!(out, br#"{"k":"a","ver":1,"n":1}"#);
        assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":1,"n":1}"#);
    }

    /// The box must be exactly as before a rejected message.
    pub(super) fn assert_unchanged(t: &BoxTable, key: &str, before: &str) {
        assert_eq!(payload(t, key), before);
    }

    #[test]
    fn keys_are_checked() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        assert_eq!(apply(&t, "", &[]), Err(MessageError::EmptyKey));
        let long = "x".repeat(129);
        assert_eq!(apply(&t, &long, &[]), Err(MessageError::KeyTooLong));
        apply(&t, &long[..128], &[]).expect("128 bytes is the limit");
        assert!(t.poll(b"nope", &mut Vec::new()).is_none());
        assert!(t.poll(b"\xff\xfe", &mut Vec::new()).is_none());
        assert_eq!(t.version(b"nope"), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn payload_over_the_limit_is_rejected_and_creates_nothing() {
        let mut plan = Plan::default_plan();
        plan.max_payload_bytes = 40;
        let t = BoxTable::new(Arc::new(plan));
        // {"k":"a","ver":1,"n":1,"by":"0123456789abcdef"} is 47 bytes.
        let long = Some(Value::Str("0123456789abcdef"));
        assert_eq!(
            apply(&t, "a", &[None, None, None, long]),
            Err(MessageError::PayloadTooLarge)
        );
        assert!(t.is_empty());
        assert_eq!(
            t.accounted_bytes(),
            BoxTable::new(Arc::new(Plan::default_plan())).accounted_bytes()
        );
        apply(&t, "a", &[]).expect("ok");
        let before = payload(&t, "a");
        assert_eq!(
            apply(&t, "a", &[None, None, None, long]),
            Err(MessageError::PayloadTooLarge)
        );
        assert_unchanged(&t, "a", &before);
    }

    #[test]
    fn max_boxes_refuses_new_keys_only() {
        let mut plan = Plan::default_plan();
        plan.max_boxes = 2;
        let t = BoxTable::new(Arc::new(plan));
        apply(&t, "a", &[i(1)]).expect("ok");
        apply(&t, "b", &[i(1)]).expect("ok");
        assert_eq!(apply(&t, "c", &[i(1)]), Err(MessageError::TooManyBoxes));
        assert_eq!(apply(&t, "a", &[i(2)]), Ok(2));
        assert_eq!(t.len(), 2);
        assert!(t.poll(b"c", &mut Vec::new()).is_none());
    }

    #[test]
    fn max_boxes_is_exact_under_four_racing_threads() {
        const MAX: usize = 500;
        const KEYS: usize = 2000;
        let mut plan = Plan::default_plan();
        plan.max_boxes = MAX;
        let t = Arc::new(BoxTable::new(Arc::new(plan)));
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|thread| {
                let (t, barrier) = (Arc::clone(&t), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut ok = 0usize;
                    // Every thread sends one message to every key, in different
                    // orders, so creations race both on the same and on
                    // different keys.
                    for n in 0..KEYS {
                        let k = if thread % 2 == 0 { n } else { KEYS - 1 - n };
                        match t.apply(&format!("key-{k}"), &[i(1)], 0, None) {
                            Ok(_) => ok += 1,
                            Err(e) => assert_eq!(e, MessageError::TooManyBoxes),
                        }
                    }
                    ok
                })
            })
            .collect();
        let ok: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        assert_eq!(t.len(), MAX);
        let mut seen = 0;
        t.for_each(0, |_, version, _, _| {
            // Once a key exists it keeps accepting: no spurious TooManyBoxes.
            assert_eq!(version, 4);
            seen += 1;
        });
        assert_eq!(seen, MAX);
        assert_eq!(ok, MAX * 4);
    }

    #[test]
    fn concurrent_polls_never_see_a_torn_payload() {
        let t = Arc::new(table_with(vec![
            field("v", FieldType::I64, Reduce::Last),
            field("sum", FieldType::I64, Reduce::Sum),
            field("n", FieldType::I64, Reduce::Count),
            field("s", FieldType::Str, Reduce::Last),
        ]));
        const PER_WRITER: i64 = 3000;
        t.apply("hot", &[i(0), i(0), None, Some(Value::Str(""))], 0, None)
            .expect("ok");
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for n in 1..=PER_WRITER {
                        // The string's length varies so records get reallocated.
                        let s = "x".repeat((n % 17) as usize);
                        t.apply("hot", &[i(n), i(1), None, Some(Value::Str(&s))], 0, None)
                            .expect("ok");
                    }
                })
            })
            .collect();
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut out = Vec::with_capacity(256);
                    while last < 1 + 2 * PER_WRITER as u64 {
                        out.clear();
                        let version = t.poll(b"hot", &mut out).expect("exists");
                        let v: serde_json::Value =
                            serde_json::from_slice(&out).expect("whole JSON");
                        assert_eq!(v["ver"], version);
                        // sum counts the messages after the first, n all of them.
                        assert_eq!(v["n"], version);
                        assert_eq!(v["sum"], version - 1);
                        // `v` and `s` come from one message.
                        let n = v["v"].as_u64().expect("v");
                        let s = v["s"].as_str().expect("s");
                        assert_eq!(s.len() as u64, n % 17, "{v}");
                        assert!(version >= last, "versions go forward");
                        last = version;
                    }
                })
            })
            .collect();
        for h in writers.into_iter().chain(pollers) {
            h.join().expect("thread");
        }
        assert_eq!(t.version(b"hot"), Some(1 + 2 * PER_WRITER as u64));
    }

    /// Whether the record of `key` holds its payload rendered.
    fn is_rendered(t: &BoxTable, key: &str) -> bool {
        let hash = t.hasher.hash_one(key.as_bytes());
        let guard = epoch::pin();
        t.find(t.shard(hash), hash, &guard, |p| {
            look(p.slot, &guard, key.as_bytes(), None)?;
            let mut image = Vec::new();
            loop {
                let r = p.slot.begin(&guard);
                r.load(&mut image);
                if r.valid() {
                    return Some(record::rendered(&image));
                }
            }
        })
        .expect("box exists")
    }

    #[test]
    fn payloads_are_rendered_by_the_first_poll_and_kept() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let by = Some(Value::Str("p\"1"));
        apply(&t, "a", &[i(7), i(7), None, by]).expect("ok");
        assert!(
            !is_rendered(&t, "a"),
            "an apply without `out` renders nothing"
        );
        // The version needs no payload.
        assert_eq!(t.version(b"a"), Some(1));
        assert!(!is_rendered(&t, "a"));
        let first = r#"{"k":"a","ver":1,"v":7,"sum":7,"n":1,"by":"p\"1"}"#;
        let mut out = b"x".to_vec();
        assert_eq!(t.poll(b"a", &mut out), Some(1));
        assert_eq!(out, [b"x".as_slice(), first.as_bytes()].concat());
        assert!(
            is_rendered(&t, "a"),
            "the first poll keeps what it rendered"
        );
        assert_eq!(payload(&t, "a"), first);
        // Updates that no poll sees are never rendered; the next poll renders
        // the newest.
        for v in 0..50 {
            apply(&t, "a", &[i(v), i(1), None, None]).expect("ok");
            assert!(!is_rendered(&t, "a"));
        }
        let want = r#"{"k":"a","ver":51,"v":49,"sum":57,"n":51,"by":"p\"1"}"#;
        assert_eq!(payload(&t, "a"), want);
        assert!(is_rendered(&t, "a"));
        // An apply with `out` renders at once, and the record keeps it.
        let mut out = Vec::new();
        t.apply("a", &[i(1), i(1), None, None], 0, Some(&mut out))
            .expect("ok");
        let want = r#"{"k":"a","ver":52,"v":1,"sum":58,"n":52,"by":"p\"1"}"#;
        assert_eq!(out, want.as_bytes());
        assert!(is_rendered(&t, "a"));
        assert_eq!(payload(&t, "a"), want);
        // A new box, created without `out`, renders on its first poll too.
        apply(&t, "b", &[]).expect("ok");
        assert!(!is_rendered(&t, "b"));
        assert_eq!(payload(&t, "b"), r#"{"k":"b","ver":1,"n":1}"#);
        // Snapshots read the state, rendered or not.
        apply(&t, "b", &[i(3)]).expect("ok");
        let mut seen = Vec::new();
        t.for_each(0, |k, v, _, s| seen.push((k.to_string(), v, s.to_vec())));
        seen.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(seen[1].1, 2);
        assert_eq!(seen[1].2[0], FieldState::I64(3));
        assert_eq!(seen[0].1, 52);
    }

    #[test]
    fn a_lazy_payload_over_the_limit_is_refused_like_a_rendered_one() {
        let mut plan = Plan::default_plan();
        // {"k":"a","ver":2,"n":2,"by":"0123456789"} is 41 bytes.
        plan.max_payload_bytes = 41;
        let t = BoxTable::new(Arc::new(plan));
        apply(&t, "a", &[]).expect("ok");
        let ten = Some(Value::Str("0123456789"));
        let eleven = Some(Value::Str("0123456789a"));
        assert_eq!(
            apply(&t, "a", &[None, None, None, eleven]),
            Err(MessageError::PayloadTooLarge)
        );
        assert_eq!(apply(&t, "a", &[None, None, None, ten]), Ok(2));
        assert_eq!(payload(&t, "a").len(), 41);
    }

    /// Writers update boxes (lazily and with `out`, growing and shrinking
    /// records), pollers poll them and check every payload against the one
    /// rendered from the version it came with: each writer's message `n` to a
    /// box sets `v` to `n` and `s` to `n % 17` characters, so a payload is
    /// whole exactly when its `s` fits its `v` and its `n` its version.
    #[test]
    fn polls_see_exactly_the_payload_of_the_version_they_report() {
        let t = Arc::new(table_with(vec![
            field("v", FieldType::I64, Reduce::Last),
            field("n", FieldType::I64, Reduce::Count),
            field("s", FieldType::Str, Reduce::Last),
        ]));
        const KEYS: [&str; 3] = ["a", "b", "c"];
        const PER_WRITER: i64 = 4000;
        for key in KEYS {
            apply(&t, key, &[i(0), None, Some(Value::Str(""))]).expect("ok");
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for n in 1..=PER_WRITER {
                        let s = "y".repeat((n % 17) as usize);
                        let key = KEYS[(n as usize + w) % KEYS.len()];
                        let values = [i(n), None, Some(Value::Str(&s))];
                        out.clear();
                        let eager = (n + w as i64) % 5 == 0;
                        let version = t
                            .apply(key, &values, 0, eager.then_some(&mut out))
                            .expect("ok");
                        if eager {
                            let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
                            assert_eq!(v["ver"], version);
                            assert_eq!(v["v"], n);
                        }
                    }
                })
            })
            .collect();
        let pollers: Vec<_> = (0..2)
            .map(|p| {
                let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut out = Vec::with_capacity(256);
                    let mut last = [0u64; 3];
                    let mut polls = 0u64;
                    // Until the writers are done, and at least once (on a
                    // busy machine they may finish before this thread runs).
                    while !stop.load(Ordering::Relaxed) || polls == 0 {
                        for (k, key) in KEYS.iter().enumerate() {
                            out.clear();
                            let version = t.poll(key.as_bytes(), &mut out).expect("exists");
                            let v: serde_json::Value =
                                serde_json::from_slice(&out).expect("whole JSON");
                            assert_eq!(v["k"], *key);
                            assert_eq!(v["ver"], version);
                            assert_eq!(v["n"], version);
                            let n = v["v"].as_u64().expect("v");
                            assert_eq!(v["s"].as_str().expect("s").len() as u64, n % 17);
                            assert!(version >= last[k], "versions go forward");
                            last[k] = version;
                            if p == 0 {
                                let now = t.version(key.as_bytes()).expect("exists");
                                assert!(now >= version);
                            }
                            polls += 1;
                        }
                    }
                    polls
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Relaxed);
        for p in pollers {
            assert!(p.join().expect("poller") > 0);
        }
        let total: u64 = KEYS
            .iter()
            .map(|k| t.version(k.as_bytes()).expect("k"))
            .sum();
        assert_eq!(total, 3 + 2 * PER_WRITER as u64, "no update was lost");
        check_consistent(&t);
    }

    #[test]
    fn for_each_and_restore_round_trip() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        for k in 0..300 {
            let by = format!("p-{k}");
            for v in 0..(k % 4 + 1) {
                apply(
                    &t,
                    &format!("box-{k}"),
                    &[i(v), i(v), None, Some(Value::Str(&by))],
                )
                .expect("ok");
            }
        }
        apply(&t, "sparse", &[]).expect("ok");
        let mut dump = Vec::new();
        t.for_each(0, |k, v, _, s| dump.push((k.to_string(), v, s.to_vec())));
        assert_eq!(dump.len(), 301);
        // The same hash seed, so the same shards fill to the same sizes and
        // the restored table accounts exactly the bytes of the original
        // (another seed would spread the keys differently, and the shards'
        // maps would grow at other points).
        let copy = BoxTable::with_hasher_of(Arc::new(Plan::default_plan()), &t);
        for (k, v, s) in &dump {
            copy.restore(k, *v, 0, s, 0).expect("restores");
        }
        assert_eq!(copy.len(), t.len());
        assert_eq!(copy.accounted_bytes(), t.accounted_bytes());
        for (k, v, _) in &dump {
            assert_eq!(payload(&copy, k), payload(&t, k));
            assert_eq!(copy.version(k.as_bytes()), Some(*v));
        }
        let sparse = dump.iter().find(|d| d.0 == "sparse").expect("present");
        assert_eq!(
            sparse.2,
            [
                FieldState::Unset,
                FieldState::Unset,
                FieldState::Count(1),
                FieldState::Unset
            ]
        );
        // And it keeps reducing from the restored state.
        assert_eq!(
            copy.apply("box-3", &[i(1), i(1), None, None], 0, None),
            Ok(5)
        );
        assert_eq!(
            payload(&copy, "box-3"),
            r#"{"k":"box-3","ver":5,"v":1,"sum":7,"n":5,"by":"p-3"}"#
        );
    }

    #[test]
    fn restore_refuses_what_does_not_fit() {
        let mut plan = Plan::default_plan();
        plan.max_boxes = 1;
        let t = BoxTable::new(Arc::new(plan));
        let ok = [
            FieldState::I64(1),
            FieldState::I64(1),
            FieldState::Count(1),
            FieldState::Unset,
        ];
        assert_eq!(t.restore("", 1, 0, &ok, 0), Err(RestoreError::EmptyKey));
        assert_eq!(
            t.restore(&"x".repeat(129), 1, 0, &ok, 0),
            Err(RestoreError::KeyTooLong { max: 128 })
        );
        assert_eq!(t.restore("a", 0, 0, &ok, 0), Err(RestoreError::ZeroVersion));
        assert_eq!(
            t.restore("a", 1, 0, &ok[..3], 0),
            Err(RestoreError::FieldCount {
                expected: 4,
                found: 3
            })
        );
        let mut bad = ok.clone();
        bad[2] = FieldState::I64(1);
        assert_eq!(
            t.restore("a", 1, 0, &bad, 0),
            Err(RestoreError::WrongType { field: "n".into() })
        );
        bad[2] = FieldState::Count(1);
        bad[3] = FieldState::Str("x".repeat(300).into());
        assert_eq!(
            t.restore("a", 1, 0, &bad, 0),
            Err(RestoreError::PayloadTooLarge { max: 256 })
        );
        t.restore("a", 7, 0, &ok, 0).expect("ok");
        assert_eq!(t.restore("a", 7, 0, &ok, 0), Err(RestoreError::Duplicate));
        assert_eq!(
            t.restore("b", 7, 0, &ok, 0),
            Err(RestoreError::TooManyBoxes { max: 1 })
        );
        assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":7,"v":1,"sum":1,"n":1}"#);
    }

    #[test]
    fn polls_stay_right_while_boxes_are_created_and_indexes_grow() {
        let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
        for k in 0..100 {
            apply(&t, &format!("old-{k}"), &[i(k)]).expect("ok");
        }
        let creator = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for k in 0..20_000 {
                    apply(&t, &format!("new-{k}"), &[i(k)]).expect("ok");
                }
            })
        };
        let mut out = Vec::with_capacity(256);
        for round in 0..20_000usize {
            for key in [format!("old-{}", round % 100), format!("new-{round}")] {
                out.clear();
                if let Some(version) = t.poll(key.as_bytes(), &mut out) {
                    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
                    assert_eq!(v["k"], key.as_str());
                    assert_eq!(version, 1);
                } else {
                    assert!(key.starts_with("new"), "{key} vanished");
                }
            }
        }
        creator.join().expect("creator");
        assert_eq!(t.len(), 20_100);
        for k in 0..20_000 {
            assert_eq!(t.version(format!("new-{k}").as_bytes()), Some(1));
        }
    }

    /// The lock-free lookup under churn: two threads poll boxes that always
    /// exist while one thread updates them (their strings' lengths vary, so
    /// records move between size classes) and another creates and removes
    /// other boxes by the thousand (removals move boxes between slots, shift
    /// index entries, retire chunks and shrink or drop maps; creations grow
    /// them). A poll must never miss a box that exists, never see a torn or
    /// foreign payload, never see a version go back; everything a reader
    /// might hold is retired through the collector meanwhile (a use after
    /// free reads garbage here, or crashes). Run in release too (`cargo test
    /// --release`), where the races are tighter.
    #[test]
    fn polls_never_miss_a_box_while_others_are_created_and_removed() {
        const STABLE: usize = 100;
        const CHURN: usize = 3000;
        const ROUNDS: usize = 6;
        let mut t = table_with(vec![
            field("v", FieldType::I64, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
        ]);
        Arc::get_mut(&mut t.plan).expect("plan").max_boxes = STABLE + CHURN;
        let t = Arc::new(t);
        let stable: Arc<Vec<String>> =
            Arc::new((0..STABLE).map(|k| format!("stable-{k}")).collect());
        for key in stable.iter() {
            t.apply(key, &[i(0), Some(Value::Str(""))], 0, None)
                .expect("ok");
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churner = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    for k in 0..CHURN {
                        apply(&t, &format!("churn-{k}"), &[i(k as i64)]).expect("ok");
                    }
                    // Remove in an order unlike the creation's, so holes open
                    // everywhere and boxes move from the ends into them.
                    for k in (0..CHURN).map(|k| (k * 7 + round) % CHURN) {
                        assert!(
                            t.remove(format!("churn-{k}").as_bytes()).is_some(),
                            "churn-{k}"
                        );
                    }
                }
            })
        };
        let updater = {
            let (t, stable, stop) = (Arc::clone(&t), Arc::clone(&stable), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = &stable[n as usize % STABLE];
                    let s = "x".repeat((n % 17) as usize);
                    let rendered = n % 3 == 0;
                    let mut out = Vec::new();
                    t.apply(
                        key,
                        &[i(n), Some(Value::Str(&s))],
                        0,
                        rendered.then_some(&mut out),
                    )
                    .expect("ok");
                }
            })
        };
        let pollers: Vec<_> = (0..2)
            .map(|p| {
                let (t, stable, stop) = (Arc::clone(&t), Arc::clone(&stable), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut last = vec![0u64; STABLE];
                    let mut out = Vec::with_capacity(256);
                    let mut polls = 0u64;
                    // Until the writers are done, and at least once (on a
                    // busy machine they may finish before this thread runs).
                    while !stop.load(Ordering::Relaxed) || polls == 0 {
                        for (k, key) in stable.iter().enumerate().skip(p) {
                            out.clear();
                            let version = t
                                .poll(key.as_bytes(), &mut out)
                                .unwrap_or_else(|| panic!("{key} missed"));
                            let v: serde_json::Value =
                                serde_json::from_slice(&out).expect("whole JSON");
                            assert_eq!(v["k"], key.as_str());
                            assert_eq!(v["ver"], version);
                            let n = v["v"].as_i64().expect("v");
                            assert_eq!(v["s"].as_str().expect("s").len() as i64, n % 17, "{v}");
                            assert!(version >= last[k], "{key} went back");
                            last[k] = version;
                            assert!(t.version(key.as_bytes()).is_some_and(|w| w >= version));
                            polls += 1;
                        }
                        // Keys that do not exist are never found.
                        assert!(t.poll(b"never", &mut out).is_none());
                    }
                    polls
                })
            })
            .collect();
        churner.join().expect("churner");
        stop.store(true, Ordering::Relaxed);
        updater.join().expect("updater");
        for p in pollers {
            assert!(p.join().expect("poller") > 0);
        }
        assert_eq!(t.len(), STABLE);
        check_consistent(&t);
    }

    #[test]
    fn boxes_sharing_a_hash_are_told_apart_by_key() {
        // Force two keys onto one hash (so one fingerprint, one probe chain).
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let hash = 0x1234_5678_9abc_def0;
        let shard = t.shard(hash);
        let guard = epoch::pin();
        for (key, version) in [("first", 3), ("second", 5)] {
            let words = new_words(&mut Vec::new(), version, key, &[], Payload::Rendered(b"{}"));
            let _writer = shard.lock();
            t.insert(shard, hash, words, NEVER, &guard);
        }
        let find = |key: &[u8], out: Option<&mut Vec<u8>>| {
            let mut out = out;
            t.find(shard, hash, &guard, |p| {
                look(p.slot, &guard, key, out.as_deref_mut()).map(|s| (p.n, s))
            })
        };
        assert_eq!(find(b"first", None), Some((0, Seen::At(3))));
        assert_eq!(find(b"second", None), Some((1, Seen::At(5))));
        assert!(find(b"third", None).is_none());
        assert!(find(b"firs", None).is_none());
        let mut out = Vec::new();
        assert_eq!(find(b"second", Some(&mut out)), Some((1, Seen::At(5))));
        assert_eq!(out, b"{}");
        // Removing the first moves the second into its slot; still found.
        assert_eq!(
            t.remove_slot(shard, 0, None, &guard)
                .map(|r| record::version(&r)),
            Some(3)
        );
        assert_eq!(find(b"second", None), Some((0, Seen::At(5))));
        assert!(find(b"first", None).is_none());
    }

    #[test]
    fn accounting_follows_inserts_and_reallocations() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let empty = t.accounted_bytes();
        assert_eq!(empty, size_class(SHARDS * std::mem::size_of::<Shard>()));
        apply(&t, "a", &[i(1), i(1), None, None]).expect("ok");
        let one = t.accounted_bytes();
        // A chunk of slots, a record of at least header + key + payload, an index.
        assert!(one - empty >= 2048 + 16 + 1 + 23 + 16, "{}", one - empty);
        apply(&t, "a", &[i(2), i(2), None, None]).expect("ok");
        assert_eq!(t.accounted_bytes(), one, "same size class: no change");
        let long = Some(Value::Str("0123456789abcdef"));
        apply(&t, "a", &[None, None, None, long]).expect("ok");
        assert!(t.accounted_bytes() > one, "a longer record is accounted");
    }

    fn ttl_table(ttl_s: u32) -> BoxTable {
        let mut plan = Plan::default_plan();
        plan.ttl_s = ttl_s;
        BoxTable::new(Arc::new(plan))
    }

    fn keys(t: &BoxTable) -> Vec<String> {
        let mut k = Vec::new();
        t.for_each(0, |key, _, _, _| k.push(key.to_string()));
        k.sort();
        k
    }

    /// Every index entry names a used slot holding a key that hashes to it
    /// and sits where a probe for it finds it, every used slot is named
    /// once, slots past the end are empty, and the count and bytes agree.
    fn check_consistent(t: &BoxTable) {
        let mut total = 0;
        let guard = epoch::pin();
        for shard in t.shards.iter() {
            let _writer = shard.lock();
            let len = shard.write.len.load(Ordering::Relaxed);
            total += len;
            let Some(map) = shard.map(&guard) else {
                assert_eq!(len, 0, "a shard with boxes has a map");
                assert_eq!(shard.write.bytes.load(Ordering::Relaxed), 0);
                continue;
            };
            assert!(len * 4 <= map.entries.len() * 3, "index at most 3/4 full");
            let chunks = map.chunk_ptrs().count();
            assert_eq!(chunks, len.div_ceil(CHUNK), "chunks in use");
            for c in 0..chunks {
                assert!(
                    !map.chunks[c].load(Ordering::Relaxed).is_null(),
                    "chunks are dense"
                );
            }
            let mut seen = vec![false; len];
            let mut entries = 0;
            for e in map.entries.iter() {
                let e = e.load(Ordering::Relaxed);
                if e == 0 {
                    continue;
                }
                entries += 1;
                let n = (e as u32 - 1) as usize;
                assert!(n < len, "entry names slot {n} of {len}");
                assert!(!std::mem::replace(&mut seen[n], true), "slot {n} twice");
                let place = map.place(n, &guard).expect("slot");
                let mut image = Vec::new();
                place.slot.begin(&guard).load(&mut image);
                let key = record::key(&image).to_vec();
                let hash = t.hasher.hash_one(&key);
                assert_eq!(t.shard(hash) as *const Shard, shard as *const Shard);
                assert_eq!((e >> 32) as u32, fingerprint(hash));
                let m = t
                    .find(shard, hash, &guard, |p| {
                        look(p.slot, &guard, &key, None).map(|_| p.n)
                    })
                    .expect("found by key");
                assert_eq!(m, n);
            }
            assert_eq!(entries, len);
            let mut records = 0;
            for n in 0..chunks * CHUNK {
                let r = map.place(n, &guard).expect("slot").slot.begin(&guard);
                assert_eq!(r.is_empty(), n >= len, "slot {n} of {len}");
                records += r.bytes();
            }
            assert_eq!(
                shard.write.bytes.load(Ordering::Relaxed),
                map.bytes() + chunks * chunk_bytes() + records,
                "accounted bytes of a shard"
            );
        }
        assert_eq!(total, t.len());
    }

    #[test]
    fn remove_takes_the_box_out_and_keeps_the_others_findable() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let empty = t.accounted_bytes();
        for k in 0..2000 {
            apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
        }
        check_consistent(&t);
        assert_eq!(t.remove(b"nope"), None);
        // Remove in an order unrelated to slot order: every removal moves some
        // shard's last box into the hole.
        for k in (0..2000).filter(|k| k % 3 != 0) {
            assert_eq!(t.remove(format!("k{k}").as_bytes()), Some(1), "k{k}");
            assert_eq!(t.remove(format!("k{k}").as_bytes()), None);
        }
        check_consistent(&t);
        assert_eq!(t.len(), 667);
        for k in 0..2000 {
            let key = format!("k{k}");
            let v = t.version(key.as_bytes());
            if k % 3 == 0 {
                assert_eq!(v, Some(1), "{key}");
                assert!(payload(&t, &key).contains(&format!(r#""v":{k}"#)));
            } else {
                assert_eq!(v, None, "{key}");
            }
        }
        for k in (0..2000).filter(|k| k % 3 == 0) {
            t.remove(format!("k{k}").as_bytes()).expect("present");
        }
        check_consistent(&t);
        assert!(t.is_empty());
        assert_eq!(t.accounted_bytes(), empty, "every byte goes back");
        assert_eq!(t.version_floor(), 1);
    }

    #[test]
    fn a_key_created_again_starts_past_every_version_it_served() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        for _ in 0..3 {
            apply(&t, "a", &[i(1)]).expect("ok");
        }
        assert_eq!(t.remove(b"a"), Some(3));
        assert_eq!(apply(&t, "a", &[i(5)]), Ok(4));
        assert_eq!(apply(&t, "a", &[i(5)]), Ok(5));
        assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":5,"v":5,"n":2}"#);
        assert_eq!(t.remove(b"a"), Some(5));
        assert_eq!(apply(&t, "a", &[]), Ok(6));
        // Boxes never removed keep starting at 1 unless they share the shard.
        let other = (0..)
            .map(|k| format!("o{k}"))
            .find(|k| {
                !std::ptr::eq(
                    t.shard(t.hasher.hash_one(k.as_bytes())),
                    t.shard(t.hasher.hash_one(b"a")),
                )
            })
            .expect("a key in another shard");
        assert_eq!(apply(&t, &other, &[]), Ok(1));
        assert_eq!(t.version_floor(), 5);
    }

    #[test]
    fn a_raised_floor_applies_to_every_shard() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        t.raise_version_floor(41);
        t.raise_version_floor(7);
        assert_eq!(t.version_floor(), 41);
        for k in 0..50 {
            assert_eq!(apply(&t, &format!("k{k}"), &[]), Ok(42));
        }
    }

    #[test]
    fn boxes_expire_in_the_order_of_their_last_message() {
        let t = ttl_table(10);
        // Last messages at seconds 0, 1, 2, ... 9 (a message moves a box on).
        for k in 0..10u64 {
            t.apply(&format!("k{k}"), &[i(1)], 0, None).expect("ok");
        }
        for k in 0..10u64 {
            t.apply(&format!("k{k}"), &[i(2)], k * 1000 + 999, None)
                .expect("ok");
        }
        let mut gone = Vec::new();
        let mut out = Vec::new();
        for now_s in 0..25u64 {
            t.expire(now_s * 1000, SweepBudget::PER_TICK, &mut out);
            for r in out.drain(..) {
                assert_eq!(r.version(), 2);
                gone.push((String::from_utf8(r.key().to_vec()).unwrap(), now_s));
            }
        }
        // k at second k: due at k + 10 + 1, more than ttl_s after its message.
        let want: Vec<_> = (0..10u64).map(|k| (format!("k{k}"), k + 11)).collect();
        assert_eq!(gone, want);
        assert!(t.is_empty());
        check_consistent(&t);
    }

    #[test]
    fn a_box_that_keeps_getting_messages_never_expires() {
        let t = ttl_table(2);
        let mut out = Vec::new();
        for now in (0..20_000u64).step_by(500) {
            t.apply("live", &[i(1)], now, None).expect("ok");
            if now == 0 {
                t.apply("idle", &[i(1)], now, None).expect("ok");
            }
            t.expire(now, SweepBudget::PER_TICK, &mut out);
        }
        let gone: Vec<_> = out.iter().map(|r| r.key().to_vec()).collect();
        assert_eq!(gone, [b"idle".to_vec()]);
        assert_eq!(keys(&t), ["live"]);
    }

    #[test]
    fn each_expiry_step_is_bounded_and_the_memory_goes_back() {
        let t = ttl_table(1);
        let empty = t.accounted_bytes();
        let one_box = {
            apply(&t, "probe", &[]).expect("ok");
            t.accounted_bytes()
        };
        assert!(one_box > empty);
        for k in 0..20_000 {
            apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
        }
        let full = t.accounted_bytes();
        let budget = SweepBudget {
            scan: 1000,
            remove: 300,
        };
        let mut out = Vec::new();
        // Not due yet: steps read stamps and remove nothing.
        let s = t.expire(1_999, budget, &mut out);
        assert_eq!(s.removed, 0);
        assert!(s.scanned <= budget.scan && s.scanned > 0, "{s:?}");
        let mut steps = 0;
        while !t.is_empty() {
            let s = t.expire(2_000, budget, &mut out);
            assert!(s.scanned <= budget.scan, "{s:?}");
            assert!(s.removed <= budget.remove, "{s:?}");
            assert_eq!(out.len(), s.removed);
            out.clear();
            steps += 1;
            assert!(steps < 1000, "the sweep makes progress");
        }
        // At most `remove` per step: 20,001 boxes need at least 67 steps.
        assert!(steps >= 20_001 / 300, "{steps} steps");
        check_consistent(&t);
        assert_eq!(t.accounted_bytes(), empty, "from {full} back to {empty}");
        assert_eq!(t.version_floor(), 1);
    }

    #[test]
    fn expiry_races_with_updates_polls_and_deletes() {
        let t = Arc::new(ttl_table(1));
        for k in 0..4000 {
            apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
        }
        let sweepers: Vec<_> = (0..2)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let budget = SweepBudget {
                        scan: 500,
                        remove: 64,
                    };
                    let mut out = Vec::new();
                    let mut removed = Vec::new();
                    for _ in 0..2000 {
                        t.expire(5_000, budget, &mut out);
                        removed.extend(out.drain(..).map(|r| r.key().to_vec()));
                    }
                    removed
                })
            })
            .collect();
        // Meanwhile "live-*" boxes are created and updated at second 5: not due.
        let mut polled = Vec::with_capacity(256);
        for k in 0..2000 {
            let key = format!("live-{}", k % 100);
            t.apply(&key, &[i(k)], 5_000, None).expect("ok");
            polled.clear();
            assert!(t.poll(key.as_bytes(), &mut polled).is_some());
            if k % 7 == 0 {
                t.remove(format!("k{k}").as_bytes());
            }
        }
        let mut removed: Vec<Vec<u8>> = Vec::new();
        for h in sweepers {
            removed.extend(h.join().expect("sweeper"));
        }
        // A box moved into a slot the sweep had passed waits for the next
        // second's pass.
        let mut out = Vec::new();
        while t.expire(6_000, SweepBudget::PER_TICK, &mut out).removed > 0 {}
        removed.extend(out.drain(..).map(|r| r.key().to_vec()));
        removed.sort();
        let before = removed.len();
        removed.dedup();
        assert_eq!(removed.len(), before, "no box is removed twice");
        assert!(
            removed.iter().all(|k| k.starts_with(b"k")),
            "live boxes stay"
        );
        assert_eq!(t.len(), 100);
        check_consistent(&t);
    }

    #[test]
    fn creation_after_a_concurrent_removal_starts_past_it() {
        // Many rounds of: one thread deletes and re-creates keys, another
        // creates them; every version a key serves is above all it served
        // before (a stale floor would hand out an old version again).
        let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deleter = {
            let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for k in 0..8 {
                        t.remove(format!("k{k}").as_bytes());
                    }
                }
            })
        };
        let mut last = [0u64; 8];
        for round in 0..20_000 {
            let k = round % 8;
            let v = apply(&t, &format!("k{k}"), &[]).expect("ok");
            assert!(v > last[k], "k{k}: version {v} after {}", last[k]);
            last[k] = v;
        }
        stop.store(true, Ordering::Relaxed);
        deleter.join().expect("deleter");
    }

    #[test]
    fn restored_boxes_keep_their_idle_time() {
        let t = ttl_table(10);
        t.apply("old", &[i(1)], 0, None).expect("ok");
        t.apply("new", &[i(1)], 8_000, None).expect("ok");
        let mut dump = Vec::new();
        t.for_each(9_500, |k, v, idle, s| {
            dump.push((k.to_string(), v, idle, s.to_vec()))
        });
        dump.sort_by(|a, b| a.0.cmp(&b.0));
        let idle: Vec<_> = dump.iter().map(|d| (d.0.as_str(), d.2)).collect();
        assert_eq!(idle, [("new", 1), ("old", 9)]);
        // A process that starts its clock at 0 again.
        let copy = ttl_table(10);
        for (k, v, idle, s) in &dump {
            copy.restore(k, *v, *idle, s, 0).expect("restores");
        }
        let mut out = Vec::new();
        copy.expire(1_999, SweepBudget::PER_TICK, &mut out);
        assert!(out.is_empty());
        copy.expire(2_000, SweepBudget::PER_TICK, &mut out);
        assert_eq!(out.iter().map(|r| r.key()).collect::<Vec<_>>(), [b"old"]);
        out.clear();
        copy.expire(10_000, SweepBudget::PER_TICK, &mut out);
        assert_eq!(out.iter().map(|r| r.key()).collect::<Vec<_>>(), [b"new"]);
        // Without a ttl the idle time is neither kept nor used.
        let never = BoxTable::new(Arc::new(Plan::default_plan()));
        never.restore("a", 1, 9, &dump[0].3, 0).expect("ok");
        never.for_each(1_000_000, |_, _, idle, _| assert_eq!(idle, 0));
    }

    #[test]
    fn shard_sides_are_cache_lines_and_table_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<BoxTable>();
        assert_eq!(std::mem::size_of::<ReadSide>(), 64);
        assert_eq!(std::mem::size_of::<Shard>(), 128);
        assert_eq!(std::mem::size_of::<Chunk>(), 2016);
        assert_eq!(chunk_bytes(), 2048);
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }
}
