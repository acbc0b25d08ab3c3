//! The box table: every box's reduced state and pre-rendered payload, shared by
//! all workers. This is where a box is updated, removed (`DELETE`) and expired
//! (docs/boxes.md). The design, with its locking rules, is docs/box-table.md.
//!
//! In short: [`SHARDS`] shards chosen by a keyed hash of the key; in each, a
//! lock-free index of slots that readers probe without locking anything; each
//! slot a seqlock around one record (version, payload, key, field state), so a
//! poll copies the payload with plain loads and checks nothing moved. Writers
//! update a record optimistically (claim the slot, store, release); creating
//! and removing boxes takes the shard's writer mutex. Memory is retired to the
//! epoch collector (crossbeam-epoch), never freed under a reader. Payloads are
//! rendered lazily, by the first poll of a version that batch ingest stored.
//!
//! One job a file:
//! - this file: the table's API (apply, poll, version, remove), the lookup
//!   ([`BoxTable::find`]) and the render of a payload left for later;
//! - `update.rs`: the update path (update a box found, create one missed);
//! - `map.rs`: a shard's index and its chunks of slots (what readers probe);
//! - `shard.rs`: the shards, their writer mutex and sequence, and the
//!   structural changes made under it (insert, remove, grow, shrink);
//! - `expiry.rs`: expiry stamps and the bounded sweep;
//! - `order.rs`: every key in order, for pages of a prefix: sets of box
//!   ids in sorted blocks (`blocks.rs`), whose keys are read from the
//!   records (`keys.rs`); `prefix.rs`: what a prefix is;
//! - `walk.rs`: the snapshot walk ([`BoxTable::for_each`]) and
//!   [`BoxTable::restore`];
//! - `reduce.rs` (one message applied to a box's state), `record.rs` (a
//!   record's byte layout), `slot.rs` (the seqlock around a record),
//!   `codec.rs` (the field state encoding), `size.rs` (allocator size
//!   classes, for the accounting).

mod blocks;
mod changes;
pub(crate) mod codec;
mod expiry;
mod keys;
mod lanes;
mod map;
mod order;
mod prefix;
mod record;
mod reduce;
mod shard;
mod size;
mod slot;
mod update;
mod walk;
mod watchers;

pub use changes::Walk;
pub use expiry::{Removed, SweepBudget, Swept};
pub use keys::Order;
pub use lanes::{enter_lane, lane_of, mark, past, pos_of, Lanes, MAX_LANES};
pub use order::{
    box_id, split_id, Held, KeyOrder, KeySource, MarkedKeys, BLOCK, ORDER_SHARDS, TOMBSTONES,
    TOMBSTONE_BYTES,
};
pub use prefix::{each_prefix_len, is_prefix, is_separator, prefixes_of};
pub use size::size_class;
pub use walk::RestoreError;
pub use watchers::Watchers;

use expiry::second;
use map::*;
use shard::*;

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};

use crate::config::Reduce;
use crate::plan::{MessageError, Plan, Value};
use crate::render::{render_fields, FieldState, FieldView};
use reduce::{with_scratch, Message, Scratch};
use slot::{backoff, Slot};
use update::{Change, Stamp, REPLAYED};

/// Number of shards. A power of two; 256 keeps writer-mutex contention low on
/// any core count we run on while costing 32 KiB.
pub const SHARDS: usize = 256;
/// The shard is taken from hash bits 40..48, outside the fingerprint (bits
/// 8..40), whose low bits choose the index bucket.
const SHARD_SHIFT: u32 = 40;
/// Slots per chunk: 102 slots (1,632 bytes), their expiry stamps (408
/// bytes), snapshot generations (204 bytes) and marks (816 bytes) fill a
/// 3 KiB allocation (3,060 bytes); at most one chunk per shard is partly used.
const CHUNK: usize = 102;
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
/// 4x cheaper than std's SipHash-1-3 for short keys (BENCHMARKS.md, "The poll path").
type KeyHasher = foldhash::quality::RandomState;

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
    /// Where a new box's version starts at least (docs/boxes.md#versions-and-etags).
    clock: VersionClock,
    /// The snapshot generation: every record written stamps its slot with it
    /// (its low 16 bits, `map::Chunk::gens`), and each snapshot walk moves it on, so a delta collects
    /// the records of the generation before (`changes.rs`).
    generation: AtomicU32,
    /// Whether removed keys are kept for the next delta snapshot (set once
    /// snapshots are written: [`BoxTable::track_changes`]).
    tracking: AtomicBool,
    /// Every key in order, for pages and prefix streams (docs/boxes.md#rooms).
    order: KeyOrder,
    /// Where each writer (or partition) stands: the marks of changes and
    /// their published cut (docs/boxes.md#watermarks).
    lanes: Lanes,
}

/// The clock a new box's first version is taken from: a standalone server's
/// is the wall clock in microseconds since the Unix epoch, so a box created
/// again (after a restart, a crash, on another node) starts past every
/// version an earlier incarnation served, as long as no box took more than
/// one version a microsecond on average. Below 2^53 until the year 2255, so a
/// version stays exact as a JavaScript number.
pub type VersionClock = fn() -> u64;

/// A random run id for a standalone table's lanes (they start again with
/// each process).
fn run_id() -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The clock of a table without one (tests, tools, a node of a log, whose
/// versions are log positions): new boxes start at 1.
fn no_clock() -> u64 {
    0
}
/// The collector (crossbeam-epoch) held pinned on this thread for a batch of table operations (a
/// worker's ready events of one turn): each poll inside pins again, which
/// then costs a counter instead of the pin's fence (BENCHMARKS.md, "The poll path"). Never
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

/// What a read of a slot found for the key looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotRead {
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
fn read_slot(
    slot: &Slot,
    guard: &Guard,
    key: &[u8],
    mut out: Option<&mut Vec<u8>>,
) -> Option<SlotRead> {
    loop {
        let r = slot.begin(guard);
        let head = r.head();
        let (key_len, payload_len) = (record::key_len(&head), record::payload_len(&head));
        let mark = out.as_ref().map_or(0, |o| o.len());
        let seen = if key_len != key.len() || !r.eq_at(record::key_start(&head), key) {
            None
        } else {
            match out.as_deref_mut() {
                None => Some(SlotRead::At(record::version(&head))),
                Some(_) if !record::rendered(&head) => Some(SlotRead::Unrendered),
                Some(o) => r
                    .copy_to(record::HEADER, payload_len, o)
                    .then(|| SlotRead::At(record::version(&head))),
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

/// The first `used` bytes of a record image, rounded up to whole words (an
/// image is always whole words: its size class).
fn whole_words(image: &[u8], used: usize) -> &[u8] {
    &image[..used.next_multiple_of(8).min(image.len())]
}

/// What [`BoxTable::apply_logged`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logged {
    /// The box is at this version now.
    Applied(u64),
    /// The box was already at the record's version or past it: unchanged.
    Replayed,
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
            clock: no_clock,
            generation: AtomicU32::new(1),
            tracking: AtomicBool::new(false),
            order: KeyOrder::default(),
            lanes: Lanes::new(run_id()),
        }
    }

    /// A table whose new boxes start past `clock` (see [`VersionClock`]).
    pub fn with_version_clock(plan: Arc<Plan>, clock: VersionClock) -> BoxTable {
        BoxTable {
            clock,
            ..BoxTable::new(plan)
        }
    }

    /// The table's version clock now (0 without one).
    pub fn version_clock(&self) -> u64 {
        (self.clock)()
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

    /// Apply one message that the projection accepted at `now_ms` (the
    /// caller's monotonic clock, which expiry counts on): `values` holds one
    /// entry per plan field (`None`: absent, the field keeps its state; a
    /// `count` field counts anyway). Reducers and the payload's length are
    /// checked before anything is written, so a rejected message changes
    /// nothing. A new box starts at version 1 (or past the table's version
    /// clock), and past every version a removed box of its shard served. If `out` is given, the new payload is rendered
    /// and appended to it; otherwise it is rendered by the first read that
    /// wants it (lazy rendering: updates that no poll sees are never
    /// rendered). Returns the box's new version.
    pub fn apply(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        now_ms: u64,
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        let mark = self.lanes.next_mark();
        self.apply_stamped(key, values, (Stamp::Next, mark), now_ms, out)
    }

    /// Apply one message read from the log at `version` (its record's log
    /// position: docs/boxes.md#versions-and-etags), as [`BoxTable::apply`]
    /// does otherwise. A box already at `version` or past it has applied
    /// this record (a replay after a restart from a snapshot, which may hold
    /// boxes newer than its offsets): it is left as it is
    /// ([`Logged::Replayed`]), so no record is applied twice. A new box
    /// starts at `version`, whatever the floor: versions from the log are
    /// never reused by a later incarnation.
    pub fn apply_logged(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        (version, lane): (u64, usize),
        now_ms: u64,
        out: Option<&mut Vec<u8>>,
    ) -> Result<Logged, MessageError> {
        debug_assert!(version > 0, "log versions are offsets + 1");
        let stamp = (Stamp::At(version), mark(lane, version));
        match self.apply_stamped(key, values, stamp, now_ms, out)? {
            REPLAYED => Ok(Logged::Replayed),
            v => Ok(Logged::Applied(v)),
        }
    }

    fn apply_stamped(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        (stamp, mark): (Stamp, u64),
        now_ms: u64,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        self.check_key(key)?;
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let expires = self.expires_at(now_ms);
        let change = Change {
            msg: Message { key, values },
            stamp,
            expires,
            mark,
        };
        let guard = epoch::pin();
        loop {
            let found = self.find(shard, hash, &guard, |p| {
                read_slot(p.slot, &guard, key.as_bytes(), None).map(|_| p)
            });
            let done = match found {
                Some(place) => self.update(shard, place, &change, out.as_deref_mut(), &guard)?,
                None => self.create(shard, hash, &change, out.as_deref_mut(), &guard)?,
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
                read_slot(p.slot, &guard, key, Some(&mut *out)).map(|seen| (p, seen))
            })?;
            match seen {
                SlotRead::At(version) => return Some(version),
                SlotRead::Unrendered => {
                    if let Some(version) = self.render_later(place.slot, key, out, &guard) {
                        return Some(version);
                    }
                }
            }
        }
    }

    /// [`BoxTable::poll`], and the mark of the change that made the payload
    /// appended (`lanes.rs`): `(version, mark)`.
    pub fn poll_marked(&self, key: &[u8], out: &mut Vec<u8>) -> Option<(u64, u64)> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let guard = epoch::pin();
        loop {
            let mark_at = out.len();
            let (place, seen, mark) = self.find(shard, hash, &guard, |p| {
                // The mark is stored under the slot's claim with the record:
                // the same before and after a valid read, it is the read's.
                let before = p.mark.load(Ordering::Acquire);
                let seen = read_slot(p.slot, &guard, key, Some(&mut *out))?;
                fence(Ordering::Acquire);
                let after = p.mark.load(Ordering::Acquire);
                Some((p, (before == after).then_some(seen), after))
            })?;
            match seen {
                Some(SlotRead::At(version)) => return Some((version, mark)),
                Some(SlotRead::Unrendered) => {
                    // Rendered (and stored) now; read again with its mark.
                    let _ = self.render_later(place.slot, key, out, &guard);
                    out.truncate(mark_at);
                }
                None => out.truncate(mark_at),
            }
        }
    }

    /// The version of `key`, or `None` if unknown (for long-polls and ETags).
    pub fn version(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let guard = epoch::pin();
        match self.find(self.shard(hash), hash, &guard, |p| {
            read_slot(p.slot, &guard, key, None)
        })? {
            SlotRead::At(version) => Some(version),
            SlotRead::Unrendered => None,
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
            read_slot(p.slot, &guard, key, None).map(|_| p.n)
        })?;
        let removed = self.remove_slot(shard, n, None, None, &guard)?;
        Some(record::version(&removed))
    }

    /// Remove the box of `key` for a tombstone read from the log at `version`
    /// in partition `lane`:
    /// only if the box is older than the tombstone (a box at `version` or
    /// past it was created again after it: a replay). Returns the last
    /// version the removed box served.
    pub fn remove_logged(&self, key: &[u8], version: u64, lane: usize) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let guard = epoch::pin();
        let _writer = shard.lock();
        let n = self.find(shard, hash, &guard, |p| {
            match read_slot(p.slot, &guard, key, None)? {
                SlotRead::At(v) if v < version => Some(Some(p.n)),
                _ => Some(None),
            }
        })??;
        let removed = self.remove_slot(shard, n, None, Some(mark(lane, version)), &guard)?;
        Some(record::version(&removed))
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
            + self.order.bytes()
            + self
                .shards
                .iter()
                .map(|s| s.write.bytes.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// Heap bytes of the tombstones the key order keeps (a bounded number:
    /// [`TOMBSTONES`] and [`TOMBSTONE_BYTES`] a set), accounted apart from
    /// the boxes.
    pub fn tombstone_bytes(&self) -> usize {
        self.order.tombstone_bytes()
    }

    /// The lanes of changes (docs/boxes.md#watermarks).
    pub fn lanes(&self) -> &Lanes {
        &self.lanes
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

    /// Run `f` with this thread's scratch buffers ([`with_scratch`]), their
    /// record image reserved ([`BoxTable::reserve_image`]).
    #[inline(always)]
    fn with_record_scratch<R>(&self, f: impl FnOnce(&mut Scratch) -> R) -> R {
        with_scratch(|scratch| {
            self.reserve_image(&mut scratch.image);
            f(scratch)
        })
    }

    fn check_key(&self, key: &str) -> Result<(), MessageError> {
        if key.is_empty() {
            Err(MessageError::EmptyKey)
        } else if key.len() > self.plan.max_key_bytes || key.len() > record::MAX_KEY {
            Err(MessageError::KeyTooLong)
        } else if crate::plan::reserved_key(key.as_bytes()) {
            Err(MessageError::ReservedKey)
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
        self.with_record_scratch(|scratch| {
            let image = &mut scratch.image;
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
}

impl fmt::Debug for BoxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxTable")
            .field("boxes", &self.len())
            .field("accounted_bytes", &self.accounted_bytes())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
