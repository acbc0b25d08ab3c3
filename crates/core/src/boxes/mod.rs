//! The box table: every box's reduced state and pre-rendered payload, shared by
//! all workers. This is where a box is updated, removed (`DELETE`) and expired
//! (SPEC §3, §3a).
//!
//! # Layout
//!
//! The table is split into [`SHARDS`] shards chosen by key hash. A shard is an
//! `RwLock` around an index (a `hashbrown::HashTable` of 8-byte entries: a
//! 32-bit fingerprint of the key's hash and a slot number) and the slots
//! themselves, in fixed chunks so they never move. A slot is an `RwLock`
//! around one byte record holding everything about the box:
//!
//! ```text
//! record = version u64 | key_len u16 | payload_len u32 | key | payload | state | slack
//! state  = per plan field: tag byte, then a varint / 8 bytes / length + UTF-8
//! ```
//!
//! The record is allocated at an allocator size class (see [`size_class`]), so a
//! payload that grows by a digit usually still fits and an update writes in
//! place without allocating.
//!
//! Beside each chunk of slots is a chunk of expiry stamps (one `AtomicU32` per
//! slot: the second, on the caller's clock, at which the box expires), so the
//! expiry sweep reads a shard's stamps in a row without locking any box.
//!
//! # Locking
//!
//! - poll: shard read lock, then the read lock of the slot whose fingerprint
//!   matches, compare the key, copy the payload. Polls never wait on each other
//!   nor on updates of other boxes (other boxes' slots are not locked unless
//!   their 32-bit fingerprint and hashbrown's 7-bit tag both collide); only the
//!   creation or removal of a box in the same shard (shard write lock: lookup,
//!   count, insert or remove, everything else prepared before or freed after)
//!   makes them wait.
//! - update of an existing box: shard read lock, slot write lock (and a store
//!   to its expiry stamp when the second changed).
//! - Locks are always taken shard first, slot second.
//!
//! # Lifecycle (SPEC §3a)
//!
//! - Removal (`DELETE`, expiry) moves the shard's last slot into the hole, so
//!   slots `0..len` stay used; a chunk left empty is freed and an index left
//!   mostly empty shrinks, so the memory goes back.
//! - Expiry: each worker calls [`BoxTable::expire`] once a tick. A step claims
//!   the next slots of a table-wide cursor (shard by shard) and reads their
//!   stamps under the shard's read lock; only when some are due does it take the
//!   write lock, for at most [`REMOVE_PER_LOCK`] removals. A step scans and
//!   removes at most its [`SweepBudget`], so no tick does more than a bounded
//!   amount of expiry work however many boxes expire at once. A pass through
//!   the table starts at most once a second (stamps count seconds): a table
//!   read through in less than a second costs nothing the rest of it.
//! - Incarnations: each shard keeps a version floor, the highest version a box
//!   removed from it served. A new box starts at the floor + 1, not at 1, so a
//!   key created again never serves a version (and so an ETag) an earlier
//!   incarnation served; a client holding an old ETag or `after` sees a newer
//!   version at once. The floor is saved in snapshots ([`BoxTable::version_floor`]).
//!
//! # Memory
//!
//! Per box: its record (header 14 + key + payload + state, rounded to a size
//! class: 112 bytes for the default config's ~65-byte payloads), a 32-byte slot,
//! a 4-byte expiry stamp and 9 bytes of index per bucket (hashbrown keeps
//! buckets 44% to 87% full). [`BoxTable::accounted_bytes`] adds these up with
//! allocator size classes as they change; it matches jemalloc's
//! `stats.allocated` within 1%.
//!
//! # Where things are
//!
//! This file is the table, its locking and the lifecycle. The rest, one job a
//! file: `reduce.rs` (the reducers: one message applied to a box's state),
//! `record.rs` (the byte layout of a record), `codec.rs` (the compact field
//! state encoding), `size.rs` (the allocator size-class model the accounting
//! uses).

pub(crate) mod codec;
mod record;
mod reduce;
mod size;

pub use size::size_class;

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use crate::config::Reduce;
use crate::plan::{MessageError, Plan, Value};
use crate::render::{render_fields, FieldState, FieldView};
use reduce::{next_record, with_scratch, Scratch};
use size::index_bytes;

/// Number of shards. A power of two; 256 keeps shard-lock contention low on
/// any core count we run on while costing 32 KiB.
pub const SHARDS: usize = 256;
/// The shard is taken from hash bits 40..48: hashbrown uses the low bits for
/// the bucket and the top 7 for its control bytes, and a shard whose keys all
/// shared those bits would probe badly.
const SHARD_SHIFT: u32 = 40;
/// Slots per chunk: a chunk is 2 KiB, at most one per shard is partly used.
const CHUNK: usize = 64;
/// Records [`BoxTable::for_each`] copies under one hold of a shard's lock.
pub const WALK_BATCH: usize = 64;
/// The expiry stamp of a box that never expires (no `ttl_s`).
const NEVER: u32 = u32::MAX;
/// Boxes removed under one shard write lock by the sweep: a poll of that shard
/// waits for at most this many removals (a few µs each).
pub const REMOVE_PER_LOCK: usize = 128;

/// The sweep's cursor at the start of a pass: shard 0, from its end.
const SWEEP_START: u64 = u32::MAX as u64;

/// The keyed hash of box keys: foldhash's quality variant with a random
/// per-table seed (keys are chosen by clients, so the hash stays keyed: an
/// attacker who cannot see the seed cannot aim keys at one probe chain). About
/// 4x cheaper than std's SipHash-1-3 for short keys (BENCHMARKS §10).
type KeyHasher = foldhash::quality::RandomState;

/// One box: the lock around its record.
type Slot = RwLock<Box<[u8]>>;

/// What a shard's lock guards.
struct ShardTable {
    /// `fingerprint << 32 | slot number`, hashed by the key.
    index: HashTable<u64>,
    /// Slot `i` is `chunks[i / CHUNK][i % CHUNK]`; slots `0..index.len()` are used.
    chunks: Vec<Box<[Slot]>>,
    /// Slot `i`'s expiry stamp is `expiry[i / CHUNK][i % CHUNK]`: the second
    /// (of the caller's clock) from which the box is due, [`NEVER`] without a
    /// ttl. Atomic, so an update under the shard's read lock can move it.
    expiry: Vec<Box<[AtomicU32]>>,
    /// The highest version a box removed from this shard served: a new box
    /// starts past it.
    floor: u64,
}

#[repr(align(64))] // shards start on their own cache line: shard locks do not false-share
struct Shard {
    table: RwLock<ShardTable>,
    /// Heap bytes of this shard: index, chunks, expiry stamps, records.
    bytes: AtomicUsize,
}

/// Every box, shared by all workers (`Arc<BoxTable>`).
pub struct BoxTable {
    plan: Arc<Plan>,
    hasher: KeyHasher,
    shards: Box<[Shard]>,
    /// Boxes created; never above `plan.max_boxes` (reserved under the shard
    /// write lock with a compare-and-swap, after the key is known to be new).
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

/// A box taken out of the table (expired): its record, freed when dropped.
pub struct Removed(Box<[u8]>);

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
/// locking them (bits 8..40: not the shard bits, mostly not hashbrown's).
#[inline]
fn fingerprint(hash: u64) -> u32 {
    (hash >> 8) as u32
}

/// The caller's clock in whole seconds, as expiry stamps count (below [`NEVER`]).
#[inline]
fn second(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).map_or(NEVER - 1, |s| s.min(NEVER - 1))
}

impl ShardTable {
    fn new() -> ShardTable {
        ShardTable {
            index: HashTable::new(),
            chunks: Vec::new(),
            expiry: Vec::new(),
            floor: 0,
        }
    }

    #[inline]
    fn slot(&self, n: u32) -> Option<&Slot> {
        let n = n as usize;
        self.chunks.get(n / CHUNK)?.get(n % CHUNK)
    }

    #[inline]
    fn stamp(&self, n: usize) -> Option<&AtomicU32> {
        self.expiry.get(n / CHUNK)?.get(n % CHUNK)
    }

    /// When the box in slot `n` expires ([`NEVER`] for a slot not in use).
    #[inline]
    fn expires(&self, n: usize) -> u32 {
        self.stamp(n).map_or(NEVER, |s| s.load(Ordering::Relaxed))
    }

    /// An accepted message moved the expiry of slot `n`. Stored only when the
    /// second changed, so updates of neighbouring boxes on several workers do
    /// not keep writing one cache line.
    #[inline]
    fn touch(&self, n: u32, expires: u32) {
        if let Some(s) = self.stamp(n as usize) {
            if s.load(Ordering::Relaxed) != expires {
                s.store(expires, Ordering::Relaxed);
            }
        }
    }

    /// The slot of `key` and its record locked with `lock`. Only slots whose
    /// fingerprint matches are locked.
    #[inline]
    fn find<'a, G: std::ops::Deref<Target = Box<[u8]>>>(
        &'a self,
        hash: u64,
        key: &[u8],
        lock: impl Fn(&'a Slot) -> G,
    ) -> Option<(u32, G)> {
        let fp = fingerprint(hash);
        for &entry in self.index.iter_hash(hash) {
            if (entry >> 32) as u32 != fp {
                continue;
            }
            let n = entry as u32;
            let Some(slot) = self.slot(n) else {
                continue;
            };
            let record = lock(slot);
            if record::key(&record) == key {
                return Some((n, record));
            }
        }
        None
    }

    /// The slot number of `key`; used under the shard's write lock, where no
    /// slot lock is held by anyone else.
    fn slot_number(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let fp = fingerprint(hash);
        self.index
            .iter_hash(hash)
            .copied()
            .filter(|&e| (e >> 32) as u32 == fp)
            .map(|e| e as u32)
            .find(|&n| self.slot(n).is_some_and(|s| record::key(&read(s)) == key))
    }

    fn slot_mut(&mut self, n: u32) -> Option<&mut Box<[u8]>> {
        let n = n as usize;
        let slot = self.chunks.get_mut(n / CHUNK)?.get_mut(n % CHUNK)?;
        Some(slot.get_mut().unwrap_or_else(PoisonError::into_inner))
    }

    /// Heap bytes of the index, chunks and stamps (records are counted apart).
    fn bytes(&self) -> usize {
        index_bytes(&self.index)
            + size_class(self.chunks.capacity() * std::mem::size_of::<Box<[Slot]>>())
            + self.chunks.len() * size_class(CHUNK * std::mem::size_of::<Slot>())
            + size_class(self.expiry.capacity() * std::mem::size_of::<Box<[AtomicU32]>>())
            + self.expiry.len() * size_class(CHUNK * std::mem::size_of::<AtomicU32>())
    }

    /// Give back what a table this much smaller no longer needs: the index
    /// shrinks once under a quarter full (to half full, so a table that grows
    /// again does not reallocate at once), the chunk lists likewise.
    fn shrink(&mut self, hasher: &KeyHasher) {
        let len = self.index.len();
        if self.index.capacity() >= 4 * len.max(8) || (len == 0 && self.index.capacity() > 0) {
            let ShardTable { index, chunks, .. } = self;
            index.shrink_to(len * 2, |&e| rehash(hasher, chunks, e));
        }
        for_both(self, |cap, used| {
            cap >= 4 * used.max(2) || (used == 0 && cap > 0)
        });
    }
}

/// Shrink both chunk lists to twice what is used when `shrink(capacity, used)`.
fn for_both(t: &mut ShardTable, shrink: impl Fn(usize, usize) -> bool) {
    let used = t.chunks.len();
    if shrink(t.chunks.capacity(), used) {
        t.chunks.shrink_to(used * 2);
        t.expiry.shrink_to(used * 2);
    }
}

/// The hash of the key in the slot an index entry names (for hashbrown's
/// rehashing; the key is in the slot's record).
fn rehash(hasher: &KeyHasher, chunks: &[Box<[Slot]>], entry: u64) -> u64 {
    let n = entry as u32 as usize;
    chunks
        .get(n / CHUNK)
        .and_then(|c| c.get(n % CHUNK))
        .map_or(0, |s| hasher.hash_one(record::key(&read(s))))
}

impl BoxTable {
    pub fn new(plan: Arc<Plan>) -> BoxTable {
        let shards = (0..SHARDS)
            .map(|_| Shard {
                table: RwLock::new(ShardTable::new()),
                bytes: AtomicUsize::new(0),
            })
            .collect();
        BoxTable {
            plan,
            hasher: KeyHasher::default(),
            shards,
            boxes: AtomicUsize::new(0),
            sweep: AtomicU64::new(SWEEP_START),
            next_pass: AtomicU32::new(0),
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
    /// `count` field counts anyway). Reducers are checked and the new payload
    /// rendered before anything is written, so a rejected message changes
    /// nothing. A new box starts at version 1, or past every version a removed
    /// box of its shard served. If `out` is given, the new payload is appended
    /// to it. Returns the box's new version.
    pub fn apply(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        now_ms: u64,
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        self.check_key(key)?;
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let expires = self.expires_at(now_ms);
        let floor = {
            let table = read(&shard.table);
            if let Some((n, mut record)) = table.find(hash, key.as_bytes(), write) {
                let version = self.update(shard, key, &mut record, values, out)?;
                table.touch(n, expires);
                return Ok(version);
            };
            table.floor
        };
        self.create(shard, hash, key, values, floor, expires, out)
    }

    /// Append the payload of `key` to `out` and return its version; `None` (and
    /// `out` untouched) for an unknown key. Allocates nothing when `out` has room.
    pub fn poll(&self, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let table = read(&self.shard(hash).table);
        let (_, record) = table.find(hash, key, read)?;
        out.extend_from_slice(record::payload(&record));
        Some(record::version(&record))
    }

    /// The version of `key`, or `None` if unknown (for long-polls and ETags).
    pub fn version(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let table = read(&self.shard(hash).table);
        let version = record::version(&table.find(hash, key, read)?.1);
        Some(version)
    }

    /// Remove the box of `key` now (`DELETE`); returns the last version it
    /// served, `None` for an unknown key. Its memory is freed before this
    /// returns, outside the shard's lock.
    pub fn remove(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let record = {
            let mut table = write(&shard.table);
            let n = table.slot_number(hash, key)?;
            self.remove_slot(shard, &mut table, n)?
        };
        Some(record::version(&record))
    }

    /// One step of the expiry sweep at `now_ms`: go on from where the last step
    /// (of any worker) stopped, read at most `budget.scan` expiry stamps and
    /// remove at most `budget.remove` boxes that are due, pushing them to
    /// `removed` (the caller wakes their long-polls, then drops them, which
    /// frees them outside every lock). Nothing to do without `ttl_s`.
    pub fn expire(&self, now_ms: u64, budget: SweepBudget, removed: &mut Vec<Removed>) -> Swept {
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
            // box the pass has yet to read ever moves. Stamps are read under
            // the read lock; the claim stops early once the boxes due are as
            // many as one write lock may remove.
            let (lo, hi, due, next) = {
                let table = read(&shard.table);
                let hi = (pos as u32 as usize).min(table.index.len());
                let mut lo = hi;
                let mut due = 0;
                while lo > 0 && hi - lo < budget.scan - done.scanned && due < room {
                    lo -= 1;
                    if table.expires(lo) <= now {
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
            let mut table = write(&shard.table);
            // The stamps are read again: an update may have moved one since.
            let mut taken = 0;
            for i in (lo..hi.min(table.index.len())).rev() {
                if taken == room {
                    break;
                }
                if table.expires(i) > now {
                    continue;
                }
                let Some(record) = self.remove_slot(shard, &mut table, i as u32) else {
                    break;
                };
                removed.push(Removed(record));
                taken += 1;
            }
            done.removed += taken;
        }
        done
    }

    /// Number of boxes.
    pub fn len(&self) -> usize {
        self.boxes.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the table, counted at allocator size classes: the
    /// shard array, every shard's index, slot chunks and stamps, and every
    /// record. Updated as boxes are created, removed and records reallocated.
    pub fn accounted_bytes(&self) -> usize {
        let fixed = size_class(self.shards.len() * std::mem::size_of::<Shard>());
        fixed
            + self
                .shards
                .iter()
                .map(|s| s.bytes.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// The highest version any removed box served (0 if none was removed): a
    /// table restored from a snapshot gets it back with
    /// [`BoxTable::raise_version_floor`], so incarnations stay apart across a
    /// restart.
    pub fn version_floor(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| read(&s.table).floor)
            .max()
            .unwrap_or(0)
    }

    /// New boxes start past `floor` from now on (in every shard: a restarted
    /// process hashes keys to other shards).
    pub fn raise_version_floor(&self, floor: u64) {
        for s in self.shards.iter() {
            let mut t = write(&s.table);
            t.floor = t.floor.max(floor);
        }
    }

    /// Call `f(key, version, idle_s, state)` for every box (snapshots):
    /// `idle_s` is how long, at `now_ms`, the box has accepted no message (0
    /// without a ttl, where it is not kept). Each box is seen whole (its lock is
    /// held while its record is copied), but boxes created or updated during the
    /// walk may or may not be seen.
    ///
    /// `f` runs with no lock held: the records of up to [`WALK_BATCH`] slots are
    /// copied under the shard's read lock, the lock is let go, and only then are
    /// they decoded and handed to `f` (which writes a file). A shard lock is so
    /// held for the time of a few small copies, never for a write: a box
    /// creation (shard write lock), and the polls that queue behind it in std's
    /// RwLock, never wait on the disk.
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
                    let table = read(&shard.table);
                    let stop = table.index.len().min(next + WALK_BATCH);
                    for i in next..stop {
                        if let Some(slot) = u32::try_from(i).ok().and_then(|i| table.slot(i)) {
                            copied.extend_from_slice(&read(slot));
                            let idle = match table.expires(i) {
                                NEVER => 0,
                                at => fresh.saturating_sub(at),
                            };
                            ends.push((copied.len(), idle));
                        }
                    }
                    next = stop;
                    if ends.is_empty() && stop == table.index.len() {
                        break;
                    }
                }
                let mut start = 0;
                for &(end, idle) in &ends {
                    let record = &copied[start..end];
                    start = end;
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
        let record = with_scratch(|scratch| {
            scratch.clear();
            for s in state {
                codec::encode(s.view(), &mut scratch.state);
            }
            let Scratch { state: st, payload } = scratch;
            render_fields(&self.plan, key, version, codec::Decoder::new(st), payload);
            if payload.len() > self.plan.max_payload_bytes {
                return Err(RestoreError::PayloadTooLarge {
                    max: self.plan.max_payload_bytes,
                });
            }
            Ok(record::build(version, key, st, payload))
        })?;
        let expires = match self.expires_at(now_ms) {
            NEVER => NEVER,
            fresh => fresh.saturating_sub(idle_s).max(second(now_ms)),
        };
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let mut table = write(&shard.table);
        if table.slot_number(hash, key.as_bytes()).is_some() {
            return Err(RestoreError::Duplicate);
        }
        self.reserve_box().map_err(|_| RestoreError::TooManyBoxes {
            max: self.plan.max_boxes,
        })?;
        self.insert(shard, &mut table, hash, record, expires);
        Ok(())
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

    /// Apply to an existing box whose record lock (or exclusive access) we hold.
    fn update(
        &self,
        shard: &Shard,
        key: &str,
        record: &mut Box<[u8]>,
        values: &[Option<Value<'_>>],
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        with_scratch(|scratch| {
            let version = next_record(
                &self.plan,
                key,
                record::state(record),
                record::version(record),
                values,
                scratch,
            )?;
            let need = record::size(key, &scratch.state, &scratch.payload);
            // Grow when it does not fit; shrink only when a class half the size
            // would do, so a payload wavering around a class edge does not
            // reallocate on every message.
            let class = size_class(need);
            if need > record.len() || class <= record.len() / 2 {
                let old = record.len();
                *record = vec![0u8; class].into_boxed_slice();
                if class >= old {
                    shard.bytes.fetch_add(class - old, Ordering::Relaxed);
                } else {
                    shard.bytes.fetch_sub(old - class, Ordering::Relaxed);
                }
            }
            record::write(record, version, key, &scratch.state, &scratch.payload);
            if let Some(out) = out {
                out.extend_from_slice(&scratch.payload);
            }
            Ok(version)
        })
    }

    /// Apply to a key not found under the read lock, where the shard's floor
    /// was `floor`: build the new box outside the write lock, then insert it
    /// unless another worker created the key meanwhile (then the message
    /// applies on top of that box). Should a box of the shard have been removed
    /// meanwhile, the floor moved and the box is built again past it (rare).
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        shard: &Shard,
        hash: u64,
        key: &str,
        values: &[Option<Value<'_>>],
        floor: u64,
        expires: u32,
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        let build = |floor: u64| {
            with_scratch(|scratch| {
                let version = next_record(&self.plan, key, &[], floor, values, scratch)?;
                let record = record::build(version, key, &scratch.state, &scratch.payload);
                Ok::<_, MessageError>((version, record))
            })
        };
        let (mut version, mut record) = build(floor)?;
        let mut table = write(&shard.table);
        if let Some(n) = table.slot_number(hash, key.as_bytes()) {
            if let Some(existing) = table.slot_mut(n) {
                let version = self.update(shard, key, existing, values, out)?;
                table.touch(n, expires);
                return Ok(version);
            }
        }
        if table.floor != floor {
            (version, record) = build(table.floor)?;
        }
        self.reserve_box()?;
        if let Some(out) = out {
            out.extend_from_slice(record::payload(&record));
        }
        self.insert(shard, &mut table, hash, record, expires);
        Ok(version)
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

    /// Store a counted, new box under the shard write lock and account for it.
    fn insert(
        &self,
        shard: &Shard,
        table: &mut ShardTable,
        hash: u64,
        record: Box<[u8]>,
        expires: u32,
    ) {
        let before = table.bytes();
        let added = record.len();
        // Shards hold far fewer than 2^32 boxes: max_boxes is a usize, but the
        // index spreads boxes over 256 shards and 2^32 records would not fit
        // in memory anyway.
        let n = table.index.len();
        if n.is_multiple_of(CHUNK) {
            table
                .chunks
                .push((0..CHUNK).map(|_| RwLock::new(Box::default())).collect());
            table
                .expiry
                .push((0..CHUNK).map(|_| AtomicU32::new(NEVER)).collect());
        }
        let ShardTable {
            index,
            chunks,
            expiry,
            ..
        } = table;
        if let Some(slot) = chunks.get_mut(n / CHUNK).and_then(|c| c.get_mut(n % CHUNK)) {
            *slot.get_mut().unwrap_or_else(PoisonError::into_inner) = record;
        }
        if let Some(stamp) = expiry.get(n / CHUNK).and_then(|c| c.get(n % CHUNK)) {
            stamp.store(expires, Ordering::Relaxed);
        }
        let entry = u64::from(fingerprint(hash)) << 32 | n as u64;
        index.insert_unique(hash, entry, |&e| rehash(&self.hasher, chunks, e));
        let after = table.bytes();
        shard
            .bytes
            .fetch_add(added + after.saturating_sub(before), Ordering::Relaxed);
    }

    /// Take the box in slot `n` out, under the shard's write lock, and return
    /// its record (the caller frees it after the lock). The shard's last slot
    /// moves into the hole so slots `0..len` stay used; an emptied chunk is
    /// freed, a mostly empty index shrinks, the floor rises to the box's version.
    fn remove_slot(&self, shard: &Shard, table: &mut ShardTable, n: u32) -> Option<Box<[u8]>> {
        let last = u32::try_from(table.index.len().checked_sub(1)?).ok()?;
        if n > last {
            return None;
        }
        let before = table.bytes();
        let record = std::mem::take(table.slot_mut(n)?);
        let hash = self.hasher.hash_one(record::key(&record));
        if let Ok(entry) = table.index.find_entry(hash, |&e| e as u32 == n) {
            entry.remove();
        }
        if n != last {
            let moved = std::mem::take(table.slot_mut(last)?);
            let moved_hash = self.hasher.hash_one(record::key(&moved));
            if let Some(e) = table.index.find_mut(moved_hash, |&e| e as u32 == last) {
                *e = (*e & !0xffff_ffff) | u64::from(n);
            }
            let expires = table.expires(last as usize);
            table.touch(n, expires);
            *table.slot_mut(n)? = moved;
        }
        if (last as usize).is_multiple_of(CHUNK) {
            // Slot `last` was the only one used in the last chunk.
            table.chunks.pop();
            table.expiry.pop();
        }
        table.shrink(&self.hasher);
        table.floor = table.floor.max(record::version(&record));
        let (was, is) = (before + record.len(), table.bytes());
        if was >= is {
            shard.bytes.fetch_sub(was - is, Ordering::Relaxed);
        } else {
            shard.bytes.fetch_add(is - was, Ordering::Relaxed);
        }
        self.boxes.fetch_sub(1, Ordering::AcqRel);
        Some(record)
    }
}

impl fmt::Debug for BoxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxTable")
            .field("boxes", &self.len())
            .field("accounted_bytes", &self.accounted_bytes())
            .finish_non_exhaustive()
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while a lock was held cannot leave a half-written record: records
    // are written only after every check passed. So poisoning is ignored.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
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
        let copy = BoxTable::new(Arc::new(Plan::default_plan()));
        for (k, v, s) in &dump {
            copy.restore(k, *v, 0, s, 0).expect("restores");
        }
        assert_eq!(copy.len(), t.len());
        // Not equal: another hash seed spreads keys over shards differently.
        let (a, b) = (copy.accounted_bytes(), t.accounted_bytes());
        assert!(a.abs_diff(b) * 10 < b, "{a} vs {b}");
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

    #[test]
    fn boxes_sharing_a_hash_are_told_apart_by_key() {
        // Force two keys onto one hash (so one fingerprint, one probe chain).
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let hash = 0x1234_5678_9abc_def0;
        let shard = t.shard(hash);
        for (key, version) in [("first", 3), ("second", 5)] {
            let record = record::build(version, key, &[], b"{}");
            let mut table = write(&shard.table);
            t.insert(shard, &mut table, hash, record, NEVER);
        }
        let table = read(&shard.table);
        let (_, first) = table.find(hash, b"first", read).expect("first");
        assert_eq!(record::version(&first), 3);
        drop(first);
        let (_, second) = table.find(hash, b"second", read).expect("second");
        assert_eq!(record::version(&second), 5);
        drop(second);
        assert!(table.find(hash, b"third", read).is_none());
    }

    #[test]
    fn accounting_follows_inserts_and_reallocations() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let empty = t.accounted_bytes();
        assert_eq!(empty, size_class(SHARDS * std::mem::size_of::<Shard>()));
        apply(&t, "a", &[i(1), i(1), None, None]).expect("ok");
        let one = t.accounted_bytes();
        // A chunk of slots, a record of at least header + key + payload, an index.
        assert!(one - empty >= 2048 + 14 + 1 + 23 + 16, "{}", one - empty);
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

    /// Every index entry names a used slot holding a key that hashes to it,
    /// every used slot is named once, and the count and bytes agree.
    fn check_consistent(t: &BoxTable) {
        let mut total = 0;
        for shard in t.shards.iter() {
            let table = read(&shard.table);
            let len = table.index.len();
            total += len;
            assert_eq!(table.chunks.len(), len.div_ceil(CHUNK));
            assert_eq!(table.expiry.len(), table.chunks.len());
            let mut seen = vec![false; len];
            for &e in table.index.iter() {
                let n = e as u32 as usize;
                assert!(n < len, "entry names slot {n} of {len}");
                assert!(!std::mem::replace(&mut seen[n], true), "slot {n} twice");
                let slot = table.slot(n as u32).expect("slot");
                let key = record::key(&read(slot)).to_vec();
                let hash = t.hasher.hash_one(&key);
                assert_eq!((e >> 32) as u32, fingerprint(hash));
                let (m, _guard) = table.find(hash, &key, read).expect("found by key");
                assert_eq!(m as usize, n);
            }
            let records: usize = (0..len)
                .map(|n| read(table.slot(n as u32).expect("slot")).len())
                .sum();
            assert_eq!(
                shard.bytes.load(Ordering::Relaxed),
                table.bytes() + records,
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
    fn shard_is_one_cache_line_and_table_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<BoxTable>();
        assert_eq!(std::mem::size_of::<Shard>() % 64, 0);
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }
}
