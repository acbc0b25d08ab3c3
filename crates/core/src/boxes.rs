//! The box table: every box's reduced state and pre-rendered payload, shared by
//! all workers. This is where a box is updated (SPEC §3).
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
//! # Locking
//!
//! - poll: shard read lock, then the read lock of the slot whose fingerprint
//!   matches, compare the key, copy the payload. Polls never wait on each other
//!   nor on updates of other boxes (other boxes' slots are not locked unless
//!   their 32-bit fingerprint and hashbrown's 7-bit tag both collide); only the
//!   creation of a new box in the same shard (shard write lock: lookup, count,
//!   insert, everything else prepared before) makes them wait.
//! - update of an existing box: shard read lock, slot write lock.
//! - Locks are always taken shard first, slot second.
//!
//! # Memory
//!
//! Per box: its record (header 14 + key + payload + state, rounded to a size
//! class: 112 bytes for the default config's ~65-byte payloads), a 32-byte slot,
//! and 9 bytes of index per bucket (hashbrown keeps buckets 44% to 87% full).
//! [`BoxTable::accounted_bytes`] adds these up with allocator size classes as
//! they change; it matches jemalloc's `stats.allocated` within 1%.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use crate::config::{FieldType, Reduce};
use crate::plan::{FieldPlan, MessageError, Plan, Value};
use crate::render::{render_fields, FieldState, FieldView};

/// Number of shards. A power of two; 256 keeps shard-lock contention low on
/// any core count we run on while costing 32 KiB.
pub const SHARDS: usize = 256;
/// The shard is taken from hash bits 40..48: hashbrown uses the low bits for
/// the bucket and the top 7 for its control bytes, and a shard whose keys all
/// shared those bits would probe badly.
const SHARD_SHIFT: u32 = 40;
/// Slots per chunk: a chunk is 2 KiB, at most one per shard is partly used.
const CHUNK: usize = 64;

/// One box: the lock around its record.
type Slot = RwLock<Box<[u8]>>;

/// What a shard's lock guards.
struct ShardTable {
    /// `fingerprint << 32 | slot number`, hashed by the key.
    index: HashTable<u64>,
    /// Slot `i` is `chunks[i / CHUNK][i % CHUNK]`; slots `0..index.len()` are used.
    chunks: Vec<Box<[Slot]>>,
}

#[repr(align(64))] // shards start on their own cache line: shard locks do not false-share
struct Shard {
    table: RwLock<ShardTable>,
    /// Heap bytes of this shard: index, chunks, records.
    bytes: AtomicUsize,
}

/// Every box, shared by all workers (`Arc<BoxTable>`).
pub struct BoxTable {
    plan: Arc<Plan>,
    hasher: RandomState,
    shards: Box<[Shard]>,
    /// Boxes created; never above `plan.max_boxes` (reserved under the shard
    /// write lock with a compare-and-swap, after the key is known to be new).
    boxes: AtomicUsize,
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

impl ShardTable {
    #[inline]
    fn slot(&self, n: u32) -> Option<&Slot> {
        let n = n as usize;
        self.chunks.get(n / CHUNK)?.get(n % CHUNK)
    }

    /// The slot of `key` locked with `lock`. Only slots whose fingerprint
    /// matches are locked.
    #[inline]
    fn find<'a, G: std::ops::Deref<Target = Box<[u8]>>>(
        &'a self,
        hash: u64,
        key: &[u8],
        lock: impl Fn(&'a Slot) -> G,
    ) -> Option<G> {
        let fp = fingerprint(hash);
        for &entry in self.index.iter_hash(hash) {
            if (entry >> 32) as u32 != fp {
                continue;
            }
            let Some(slot) = self.slot(entry as u32) else {
                continue;
            };
            let record = lock(slot);
            if record::key(&record) == key {
                return Some(record);
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

    /// Heap bytes of the index and chunks (records are counted apart).
    fn bytes(&self) -> usize {
        index_bytes(&self.index)
            + size_class(self.chunks.capacity() * std::mem::size_of::<Box<[Slot]>>())
            + self.chunks.len() * size_class(CHUNK * std::mem::size_of::<Slot>())
    }
}

impl BoxTable {
    pub fn new(plan: Arc<Plan>) -> BoxTable {
        let shards = (0..SHARDS)
            .map(|_| Shard {
                table: RwLock::new(ShardTable {
                    index: HashTable::new(),
                    chunks: Vec::new(),
                }),
                bytes: AtomicUsize::new(0),
            })
            .collect();
        BoxTable {
            plan,
            hasher: RandomState::new(),
            shards,
            boxes: AtomicUsize::new(0),
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Apply one message that the projection accepted: `values` holds one entry
    /// per plan field (`None`: absent, the field keeps its state; a `count`
    /// field counts anyway). Reducers are checked and the new payload rendered
    /// before anything is written, so a rejected message changes nothing.
    /// A new box starts at version 1. If `out` is given, the new payload is
    /// appended to it. Returns the box's new version.
    pub fn apply(
        &self,
        key: &str,
        values: &[Option<Value<'_>>],
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        self.check_key(key)?;
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        {
            let table = read(&shard.table);
            if let Some(mut record) = table.find(hash, key.as_bytes(), write) {
                return self.update(shard, key, &mut record, values, out);
            };
        }
        self.create(shard, hash, key, values, out)
    }

    /// Append the payload of `key` to `out` and return its version; `None` (and
    /// `out` untouched) for an unknown key. Allocates nothing when `out` has room.
    pub fn poll(&self, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let table = read(&self.shard(hash).table);
        let record = table.find(hash, key, read)?;
        out.extend_from_slice(record::payload(&record));
        Some(record::version(&record))
    }

    /// The version of `key`, or `None` if unknown (for long-polls and ETags).
    pub fn version(&self, key: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let table = read(&self.shard(hash).table);
        let version = record::version(&table.find(hash, key, read)?);
        Some(version)
    }

    /// Number of boxes.
    pub fn len(&self) -> usize {
        self.boxes.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the table, counted at allocator size classes: the
    /// shard array, every shard's index and slot chunks, and every record.
    /// Updated as boxes are created and records reallocated.
    pub fn accounted_bytes(&self) -> usize {
        let fixed = size_class(self.shards.len() * std::mem::size_of::<Shard>());
        fixed
            + self
                .shards
                .iter()
                .map(|s| s.bytes.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// Call `f(key, version, state)` for every box (snapshots). Each box is
    /// seen whole (its lock is held while its state is read), but boxes
    /// created or updated during the walk may or may not be seen. `f` runs
    /// under the shard's read lock: keep it short (it delays box creation in
    /// that shard, never polls or updates).
    pub fn for_each(&self, mut f: impl FnMut(&str, u64, &[FieldState])) {
        let n = self.plan.fields.len();
        let mut states: Vec<FieldState> = Vec::with_capacity(n);
        let mut key = String::new();
        for shard in self.shards.iter() {
            let table = read(&shard.table);
            for i in 0..table.index.len() {
                let Some(slot) = u32::try_from(i).ok().and_then(|i| table.slot(i)) else {
                    continue;
                };
                let version = {
                    let record = read(slot);
                    states.clear();
                    states.extend(
                        state::Decoder::new(record::state(&record))
                            .take(n)
                            .map(FieldView::to_state),
                    );
                    key.clear();
                    // Keys are stored from a `&str`.
                    key.push_str(std::str::from_utf8(record::key(&record)).unwrap_or_default());
                    record::version(&record)
                };
                f(&key, version, &states);
            }
        }
    }

    /// Insert a box as a snapshot recorded it: `state` has one entry per plan
    /// field. The payload is rendered again (so a changed field name or order
    /// cannot leave stale payloads); a key already present is refused.
    pub fn restore(
        &self,
        key: &str,
        version: u64,
        state: &[FieldState],
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
                state::encode(s.view(), &mut scratch.state);
            }
            let Scratch { state: st, payload } = scratch;
            render_fields(&self.plan, key, version, state::Decoder::new(st), payload);
            if payload.len() > self.plan.max_payload_bytes {
                return Err(RestoreError::PayloadTooLarge {
                    max: self.plan.max_payload_bytes,
                });
            }
            Ok(record::build(version, key, st, payload))
        })?;
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard(hash);
        let mut table = write(&shard.table);
        if table.slot_number(hash, key.as_bytes()).is_some() {
            return Err(RestoreError::Duplicate);
        }
        self.reserve_box().map_err(|_| RestoreError::TooManyBoxes {
            max: self.plan.max_boxes,
        })?;
        self.insert(shard, &mut table, hash, record);
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

    /// Apply to a key not found under the read lock: build the new box outside
    /// the write lock, then insert it unless another worker created the key
    /// meanwhile (then the message applies on top of that box).
    fn create(
        &self,
        shard: &Shard,
        hash: u64,
        key: &str,
        values: &[Option<Value<'_>>],
        out: Option<&mut Vec<u8>>,
    ) -> Result<u64, MessageError> {
        let record = with_scratch(|scratch| {
            next_record(&self.plan, key, &[], 0, values, scratch)?;
            Ok::<_, MessageError>(record::build(1, key, &scratch.state, &scratch.payload))
        })?;
        let mut table = write(&shard.table);
        if let Some(n) = table.slot_number(hash, key.as_bytes()) {
            if let Some(existing) = table.slot_mut(n) {
                return self.update(shard, key, existing, values, out);
            }
        }
        self.reserve_box()?;
        if let Some(out) = out {
            out.extend_from_slice(record::payload(&record));
        }
        self.insert(shard, &mut table, hash, record);
        Ok(1)
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
    fn insert(&self, shard: &Shard, table: &mut ShardTable, hash: u64, record: Box<[u8]>) {
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
        }
        let ShardTable { index, chunks } = table;
        if let Some(slot) = chunks.get_mut(n / CHUNK).and_then(|c| c.get_mut(n % CHUNK)) {
            *slot.get_mut().unwrap_or_else(PoisonError::into_inner) = record;
        }
        let entry = u64::from(fingerprint(hash)) << 32 | n as u64;
        index.insert_unique(hash, entry, |&e| {
            // Rehashing on growth: the key is in the slot's record.
            let n = e as u32 as usize;
            chunks
                .get(n / CHUNK)
                .and_then(|c| c.get(n % CHUNK))
                .map_or(0, |s| self.hasher.hash_one(record::key(&read(s))))
        });
        let after = table.bytes();
        shard
            .bytes
            .fetch_add(added + after.saturating_sub(before), Ordering::Relaxed);
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

/// Compute the next state and payload of a box from its current state (empty
/// for a new box) into `scratch`. Returns the new version.
fn next_record(
    plan: &Plan,
    key: &str,
    old_state: &[u8],
    old_version: u64,
    values: &[Option<Value<'_>>],
    scratch: &mut Scratch,
) -> Result<u64, MessageError> {
    scratch.clear();
    // Sized once per thread for the largest payload, so they never grow on the
    // steady path (reserve is a no-op once the capacity is there).
    scratch.payload.reserve(plan.max_payload_bytes + 1);
    scratch
        .state
        .reserve(plan.max_payload_bytes + 16 * plan.fields.len());
    let mut old = state::Decoder::new(old_state);
    for (i, field) in plan.fields.iter().enumerate() {
        let prev = old.next().unwrap_or_default();
        let value = values.get(i).copied().flatten();
        let next = reduce(field, i, prev, value)?;
        state::encode(next, &mut scratch.state);
    }
    let version = old_version.saturating_add(1);
    let Scratch { state: st, payload } = scratch;
    render_fields(plan, key, version, state::Decoder::new(st), payload);
    if payload.len() > plan.max_payload_bytes {
        return Err(MessageError::PayloadTooLarge);
    }
    Ok(version)
}

fn field_index(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

/// One reducer step for one field.
fn reduce<'a>(
    field: &FieldPlan,
    i: usize,
    prev: FieldView<'a>,
    value: Option<Value<'a>>,
) -> Result<FieldView<'a>, MessageError> {
    use FieldView as V;
    if field.reduce == Reduce::Count {
        let n = match prev {
            V::Count(n) => n,
            _ => 0,
        };
        return Ok(V::Count(n.saturating_add(1)));
    }
    let Some(value) = value else {
        return Ok(prev);
    };
    let idx = field_index(i);
    let next = typed(field, idx, value)?;
    Ok(match (field.reduce, prev, next) {
        (Reduce::Sum, V::I64(a), V::I64(b)) => V::I64(
            a.checked_add(b)
                .ok_or(MessageError::SumOverflow { field: idx })?,
        ),
        (Reduce::Sum, V::F64(a), V::F64(b)) => {
            let s = a + b;
            if !s.is_finite() {
                return Err(MessageError::SumOverflow { field: idx });
            }
            V::F64(s)
        }
        (Reduce::Min, V::I64(a), V::I64(b)) => V::I64(a.min(b)),
        (Reduce::Max, V::I64(a), V::I64(b)) => V::I64(a.max(b)),
        (Reduce::Min, V::F64(a), V::F64(b)) => V::F64(if b < a { b } else { a }),
        (Reduce::Max, V::F64(a), V::F64(b)) => V::F64(if b > a { b } else { a }),
        // `last`, and the first value of sum/min/max.
        _ => next,
    })
}

/// Check a value against the field's type. The projection already did; this
/// keeps the table's invariants (no non-finite f64, strings within max_len)
/// whoever calls it. An integer is accepted for an f64 field.
fn typed<'a>(field: &FieldPlan, idx: u16, value: Value<'a>) -> Result<FieldView<'a>, MessageError> {
    match (field.ty, value) {
        (FieldType::I64, Value::I64(v)) => Ok(FieldView::I64(v)),
        (FieldType::F64, Value::F64(v)) if v.is_finite() => Ok(FieldView::F64(v)),
        (FieldType::F64, Value::I64(v)) => Ok(FieldView::F64(v as f64)),
        (FieldType::Bool, Value::Bool(b)) => Ok(FieldView::Bool(b)),
        (FieldType::Str, Value::Str(s)) if field.max_len > 0 && s.len() > field.max_len => {
            Err(MessageError::StringTooLong { field: idx })
        }
        (FieldType::Str, Value::Str(s)) => Ok(FieldView::Str(s)),
        _ => Err(MessageError::WrongType { field: idx }),
    }
}

/// Per-thread buffers the next record is built in, so updating an existing box
/// allocates nothing once they have grown to a payload's size.
#[derive(Default)]
struct Scratch {
    state: Vec<u8>,
    payload: Vec<u8>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            state: Vec::new(),
            payload: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.state.clear();
        self.payload.clear();
    }
}

thread_local! {
    static SCRATCH: Cell<Scratch> = const { Cell::new(Scratch::new()) };
}

/// Run `f` with this thread's scratch buffers (taken out and put back, so a
/// nested call or a thread being torn down just gets fresh ones).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
    let r = f(&mut scratch);
    let _ = SCRATCH.try_with(|c| c.set(scratch));
    r
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while a lock was held cannot leave a half-written record: records
    // are written only after every check passed. So poisoning is ignored.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// The size an allocation of `n` bytes really takes, following jemalloc's size
/// classes (16-byte steps up to 128, then four classes per power of two), so
/// accounted bytes track what the allocator reports.
pub fn size_class(n: usize) -> usize {
    match n {
        0 => 0,
        1..=8 => 8,
        9..=128 => (n + 15) & !15,
        _ => {
            let lg = usize::BITS - 1 - (n - 1).leading_zeros();
            let step = 1usize << (lg - 2);
            (n + step - 1) & !(step - 1)
        }
    }
}

/// Bytes of a hashbrown index's single allocation: one 8-byte entry and one
/// control byte per bucket, plus a group of trailing control bytes.
fn index_bytes(index: &HashTable<u64>) -> usize {
    const GROUP_WIDTH: usize = 16;
    let cap = index.capacity();
    if cap == 0 {
        return 0;
    }
    // hashbrown keeps 1/8 of the buckets free (all but one for tables under 8).
    let buckets = if cap < 8 { cap + 1 } else { cap / 7 * 8 };
    let data = (buckets * std::mem::size_of::<u64>() + GROUP_WIDTH - 1) & !(GROUP_WIDTH - 1);
    size_class(data + buckets + GROUP_WIDTH)
}

/// A box's record: header, key, payload, encoded state, unused slack.
mod record {
    const HEADER: usize = 14;
    /// Key lengths are stored in 16 bits (the config allows at most 4096).
    pub(super) const MAX_KEY: usize = u16::MAX as usize;

    fn key_len(r: &[u8]) -> usize {
        r.get(8..10)
            .and_then(|b| b.try_into().ok())
            .map_or(0, |b| u16::from_le_bytes(b) as usize)
    }

    fn payload_len(r: &[u8]) -> usize {
        r.get(10..14)
            .and_then(|b| b.try_into().ok())
            .map_or(0, |b| u32::from_le_bytes(b) as usize)
    }

    pub(super) fn version(r: &[u8]) -> u64 {
        r.get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }

    pub(super) fn key(r: &[u8]) -> &[u8] {
        r.get(HEADER..HEADER + key_len(r)).unwrap_or(&[])
    }

    pub(super) fn payload(r: &[u8]) -> &[u8] {
        let start = HEADER + key_len(r);
        r.get(start..start + payload_len(r)).unwrap_or(&[])
    }

    /// The encoded state and the slack after it (the state decoder reads one
    /// entry per field and never looks further).
    pub(super) fn state(r: &[u8]) -> &[u8] {
        r.get(HEADER + key_len(r) + payload_len(r)..).unwrap_or(&[])
    }

    pub(super) fn size(key: &str, state: &[u8], payload: &[u8]) -> usize {
        HEADER + key.len() + payload.len() + state.len()
    }

    /// Write a record into `r`, which the caller sized with [`size`]. The key
    /// is at most [`MAX_KEY`] bytes (checked on entry), the payload at most
    /// max_payload_bytes (at most 64 KiB).
    pub(super) fn write(r: &mut [u8], version: u64, key: &str, state: &[u8], payload: &[u8]) {
        let (k, p) = (key.len(), payload.len());
        debug_assert!(k <= MAX_KEY && r.len() >= size(key, state, payload));
        r[..8].copy_from_slice(&version.to_le_bytes());
        r[8..10].copy_from_slice(&(k as u16).to_le_bytes());
        r[10..14].copy_from_slice(&(p as u32).to_le_bytes());
        let body = &mut r[HEADER..];
        body[..k].copy_from_slice(key.as_bytes());
        body[k..k + p].copy_from_slice(payload);
        body[k + p..k + p + state.len()].copy_from_slice(state);
    }

    /// A new record, allocated at its size class.
    pub(super) fn build(version: u64, key: &str, state: &[u8], payload: &[u8]) -> Box<[u8]> {
        let mut r = vec![0u8; super::size_class(size(key, state, payload))];
        write(&mut r, version, key, state, payload);
        r.into_boxed_slice()
    }
}

/// The compact state encoding inside a record: per field a tag, then a zigzag
/// varint (i64), a varint (count), 8 bytes (f64), or a varint length and UTF-8
/// (str). Small numbers, the common case, take one or two bytes.
mod state {
    use crate::render::FieldView;

    const UNSET: u8 = 0;
    const I64: u8 = 1;
    const F64: u8 = 2;
    const FALSE: u8 = 3;
    const TRUE: u8 = 4;
    const STR: u8 = 5;
    const COUNT: u8 = 6;

    fn put_varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub(super) fn encode(v: FieldView<'_>, out: &mut Vec<u8>) {
        match v {
            FieldView::Unset => out.push(UNSET),
            FieldView::I64(x) => {
                out.push(I64);
                put_varint(((x << 1) ^ (x >> 63)) as u64, out);
            }
            FieldView::F64(x) => {
                out.push(F64);
                out.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            FieldView::Bool(b) => out.push(if b { TRUE } else { FALSE }),
            FieldView::Str(s) => {
                out.push(STR);
                put_varint(s.len() as u64, out);
                out.extend_from_slice(s.as_bytes());
            }
            FieldView::Count(n) => {
                out.push(COUNT);
                put_varint(n, out);
            }
        }
    }

    /// Yields one view per field, then `Unset` forever (a new box's state is
    /// the empty slice). Records are written only by this module, so a
    /// malformed one is a bug; it reads as unset fields rather than a panic.
    pub(super) struct Decoder<'a> {
        rest: &'a [u8],
    }

    impl<'a> Decoder<'a> {
        pub(super) fn new(state: &'a [u8]) -> Decoder<'a> {
            Decoder { rest: state }
        }

        fn varint(&mut self) -> Option<u64> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let (&b, rest) = self.rest.split_first()?;
                self.rest = rest;
                v |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return Some(v);
                }
            }
            None
        }

        fn one(&mut self) -> Option<FieldView<'a>> {
            let (&tag, rest) = self.rest.split_first()?;
            self.rest = rest;
            Some(match tag {
                UNSET => FieldView::Unset,
                I64 => {
                    let z = self.varint()?;
                    FieldView::I64(((z >> 1) as i64) ^ -((z & 1) as i64))
                }
                F64 => {
                    let (bits, rest) = self.rest.split_first_chunk::<8>()?;
                    self.rest = rest;
                    FieldView::F64(f64::from_bits(u64::from_le_bytes(*bits)))
                }
                FALSE => FieldView::Bool(false),
                TRUE => FieldView::Bool(true),
                STR => {
                    let len = usize::try_from(self.varint()?).ok()?;
                    let bytes = self.rest.get(..len)?;
                    self.rest = &self.rest[len..];
                    FieldView::Str(std::str::from_utf8(bytes).ok()?)
                }
                COUNT => FieldView::Count(self.varint()?),
                _ => return None,
            })
        }
    }

    impl<'a> Iterator for Decoder<'a> {
        type Item = FieldView<'a>;

        fn next(&mut self) -> Option<FieldView<'a>> {
            Some(self.one().unwrap_or_else(|| {
                self.rest = &[];
                FieldView::Unset
            }))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_view_round_trips() {
            let views = [
                FieldView::Unset,
                FieldView::I64(0),
                FieldView::I64(-1),
                FieldView::I64(63),
                FieldView::I64(-64),
                FieldView::I64(i64::MIN),
                FieldView::I64(i64::MAX),
                FieldView::F64(-0.0),
                FieldView::F64(1.5e300),
                FieldView::Bool(true),
                FieldView::Bool(false),
                FieldView::Str(""),
                FieldView::Str("日本\"x"),
                FieldView::Count(0),
                FieldView::Count(u64::MAX),
            ];
            let mut buf = Vec::new();
            for v in views {
                encode(v, &mut buf);
            }
            let back: Vec<_> = Decoder::new(&buf).take(views.len() + 2).collect();
            assert_eq!(back[..views.len()], views);
            assert_eq!(back[views.len()..], [FieldView::Unset, FieldView::Unset]);
        }

        #[test]
        fn small_numbers_take_two_bytes() {
            let mut buf = Vec::new();
            encode(FieldView::I64(-60), &mut buf);
            encode(FieldView::Count(100), &mut buf);
            assert_eq!(buf.len(), 4);
        }

        #[test]
        fn malformed_reads_as_unset() {
            for bad in [
                &[I64, 0x80][..],
                &[STR, 5, b'a'],
                &[F64, 1, 2],
                &[99],
                &[STR, 1, 0xff],
            ] {
                let v: Vec<_> = Decoder::new(bad).take(2).collect();
                assert_eq!(v, [FieldView::Unset, FieldView::Unset], "{bad:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
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

    fn table_with(fields: Vec<FieldPlan>) -> BoxTable {
        BoxTable::new(Arc::new(Plan {
            key_field: "key".into(),
            max_key_bytes: 16,
            max_payload_bytes: 256,
            max_boxes: 1000,
            fields,
        }))
    }

    fn payload(t: &BoxTable, key: &str) -> String {
        let mut out = Vec::new();
        t.poll(key.as_bytes(), &mut out).expect("box exists");
        String::from_utf8(out).expect("UTF-8 payload")
    }

    fn apply(t: &BoxTable, key: &str, values: &[Option<Value<'_>>]) -> Result<u64, MessageError> {
        t.apply(key, values, None)
    }

    fn i(v: i64) -> Option<Value<'static>> {
        Some(Value::I64(v))
    }

    fn f(v: f64) -> Option<Value<'static>> {
        Some(Value::F64(v))
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
            t.apply("a", &[None, None, None, None], Some(&mut out)),
            Ok(1)
        );
        assert_eq!(out, br#"{"k":"a","ver":1,"n":1}"#);
        assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":1,"n":1}"#);
    }

    #[test]
    fn absent_fields_keep_their_state_but_count_counts() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        apply(&t, "a", &[i(3), i(3), None, Some(Value::Str("x"))]).expect("ok");
        apply(&t, "a", &[None, None, Some(Value::Bool(true)), None]).expect("ok");
        apply(&t, "a", &[]).expect("a short values slice means absent fields");
        assert_eq!(
            payload(&t, "a"),
            r#"{"k":"a","ver":3,"v":3,"sum":3,"n":3,"by":"x"}"#
        );
    }

    #[test]
    fn i64_reducers() {
        let t = table_with(vec![
            field("last", FieldType::I64, Reduce::Last),
            field("sum", FieldType::I64, Reduce::Sum),
            field("min", FieldType::I64, Reduce::Min),
            field("max", FieldType::I64, Reduce::Max),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        for v in [4, -2, 9, 1] {
            apply(&t, "k", &[i(v), i(v), i(v), i(v), i(1000)]).expect("ok");
        }
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":4,"last":1,"sum":12,"min":-2,"max":9,"n":4}"#
        );
    }

    #[test]
    fn f64_reducers_and_integers_for_f64_fields() {
        let t = table_with(vec![
            field("last", FieldType::F64, Reduce::Last),
            field("sum", FieldType::F64, Reduce::Sum),
            field("min", FieldType::F64, Reduce::Min),
            field("max", FieldType::F64, Reduce::Max),
        ]);
        apply(&t, "k", &[f(0.5), f(0.5), f(0.5), f(0.5)]).expect("ok");
        apply(&t, "k", &[f(-1.25), f(-1.25), f(-1.25), f(-1.25)]).expect("ok");
        apply(&t, "k", &[i(3), i(3), i(3), i(3)]).expect("an integer is a number");
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":3,"last":3.0,"sum":2.25,"min":-1.25,"max":3.0}"#
        );
    }

    #[test]
    fn bool_and_str_last() {
        let t = table_with(vec![
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
        ]);
        apply(
            &t,
            "k",
            &[Some(Value::Bool(true)), Some(Value::Str("é\"\n"))],
        )
        .expect("ok");
        assert_eq!(
            payload(&t, "k"),
            r#"{"k":"k","ver":1,"b":true,"s":"é\"\n"}"#
        );
        apply(&t, "k", &[Some(Value::Bool(false)), Some(Value::Str(""))]).expect("ok");
        assert_eq!(payload(&t, "k"), r#"{"k":"k","ver":2,"b":false,"s":""}"#);
    }

    /// The box must be exactly as before a rejected message.
    fn assert_unchanged(t: &BoxTable, key: &str, before: &str) {
        assert_eq!(payload(t, key), before);
    }

    #[test]
    fn i64_sum_overflow_at_the_edge_rejects_and_changes_nothing() {
        let t = table_with(vec![
            field("v", FieldType::I64, Reduce::Last),
            field("sum", FieldType::I64, Reduce::Sum),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        apply(&t, "up", &[i(i64::MAX - 1), i(i64::MAX - 1), None]).expect("ok");
        apply(&t, "up", &[i(1), i(1), None]).expect("exactly i64::MAX is fine");
        let before = payload(&t, "up");
        assert!(before.contains(&format!(r#""sum":{}"#, i64::MAX)));
        assert_eq!(
            apply(&t, "up", &[i(7), i(1), None]),
            Err(MessageError::SumOverflow { field: 1 })
        );
        assert_unchanged(&t, "up", &before);

        apply(&t, "down", &[None, i(i64::MIN + 1), None]).expect("ok");
        apply(&t, "down", &[None, i(-1), None]).expect("exactly i64::MIN is fine");
        let before = payload(&t, "down");
        assert_eq!(
            apply(&t, "down", &[None, i(-1), None]),
            Err(MessageError::SumOverflow { field: 1 })
        );
        assert_unchanged(&t, "down", &before);
        assert_eq!(t.version(b"down"), Some(2));
    }

    #[test]
    fn f64_sum_that_is_not_finite_is_an_overflow() {
        let t = table_with(vec![field("sum", FieldType::F64, Reduce::Sum)]);
        apply(&t, "k", &[f(f64::MAX)]).expect("ok");
        let before = payload(&t, "k");
        assert_eq!(
            apply(&t, "k", &[f(f64::MAX)]),
            Err(MessageError::SumOverflow { field: 0 })
        );
        assert_unchanged(&t, "k", &before);
        apply(&t, "k", &[f(-f64::MAX)]).expect("back to zero");
        assert_eq!(payload(&t, "k"), r#"{"k":"k","ver":2,"sum":0.0}"#);
    }

    #[test]
    fn min_max_at_the_edges() {
        let t = table_with(vec![
            field("min", FieldType::I64, Reduce::Min),
            field("max", FieldType::I64, Reduce::Max),
            field("fmin", FieldType::F64, Reduce::Min),
            field("fmax", FieldType::F64, Reduce::Max),
        ]);
        apply(&t, "k", &[i(0), i(0), f(0.0), f(0.0)]).expect("ok");
        apply(
            &t,
            "k",
            &[i(i64::MIN), i(i64::MAX), f(-f64::MAX), f(f64::MAX)],
        )
        .expect("ok");
        apply(&t, "k", &[i(5), i(-5), f(1.0), f(-1.0)]).expect("ok");
        let v: serde_json::Value = serde_json::from_str(&payload(&t, "k")).expect("JSON");
        assert_eq!(v["min"], i64::MIN);
        assert_eq!(v["max"], i64::MAX);
        assert_eq!(v["fmin"], -f64::MAX);
        assert_eq!(v["fmax"], f64::MAX);
    }

    #[test]
    fn wrong_types_are_rejected_whole() {
        let t = table_with(vec![
            field("i", FieldType::I64, Reduce::Sum),
            field("f", FieldType::F64, Reduce::Last),
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
            field("n", FieldType::I64, Reduce::Count),
        ]);
        apply(
            &t,
            "k",
            &[
                i(1),
                f(1.0),
                Some(Value::Bool(true)),
                Some(Value::Str("a")),
                None,
            ],
        )
        .expect("ok");
        let before = payload(&t, "k");
        let cases: [(Vec<Option<Value<'_>>>, u16); 6] = [
            (vec![f(1.0)], 0),
            (vec![i(2), Some(Value::Str("1"))], 1),
            (vec![i(2), f(f64::NAN)], 1),
            (vec![i(2), f(f64::INFINITY)], 1),
            (vec![i(2), None, i(1)], 2),
            (vec![i(2), None, None, Some(Value::Bool(false))], 3),
        ];
        for (values, field) in cases {
            assert_eq!(
                apply(&t, "k", &values),
                Err(MessageError::WrongType { field }),
                "{values:?}"
            );
            assert_unchanged(&t, "k", &before);
        }
        assert_eq!(
            apply(
                &t,
                "k",
                &[None, None, None, Some(Value::Str("seventeen bytes!!"))]
            ),
            Err(MessageError::StringTooLong { field: 3 })
        );
        assert_unchanged(&t, "k", &before);
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
                        match t.apply(&format!("key-{k}"), &[i(1)], None) {
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
        t.for_each(|_, version, _| {
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
        t.apply("hot", &[i(0), i(0), None, Some(Value::Str(""))], None)
            .expect("ok");
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for n in 1..=PER_WRITER {
                        // The string's length varies so records get reallocated.
                        let s = "x".repeat((n % 17) as usize);
                        t.apply("hot", &[i(n), i(1), None, Some(Value::Str(&s))], None)
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
        t.for_each(|k, v, s| dump.push((k.to_string(), v, s.to_vec())));
        assert_eq!(dump.len(), 301);
        let copy = BoxTable::new(Arc::new(Plan::default_plan()));
        for (k, v, s) in &dump {
            copy.restore(k, *v, s).expect("restores");
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
        assert_eq!(copy.apply("box-3", &[i(1), i(1), None, None], None), Ok(5));
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
        assert_eq!(t.restore("", 1, &ok), Err(RestoreError::EmptyKey));
        assert_eq!(
            t.restore(&"x".repeat(129), 1, &ok),
            Err(RestoreError::KeyTooLong { max: 128 })
        );
        assert_eq!(t.restore("a", 0, &ok), Err(RestoreError::ZeroVersion));
        assert_eq!(
            t.restore("a", 1, &ok[..3]),
            Err(RestoreError::FieldCount {
                expected: 4,
                found: 3
            })
        );
        let mut bad = ok.clone();
        bad[2] = FieldState::I64(1);
        assert_eq!(
            t.restore("a", 1, &bad),
            Err(RestoreError::WrongType { field: "n".into() })
        );
        bad[2] = FieldState::Count(1);
        bad[3] = FieldState::Str("x".repeat(300).into());
        assert_eq!(
            t.restore("a", 1, &bad),
            Err(RestoreError::PayloadTooLarge { max: 256 })
        );
        t.restore("a", 7, &ok).expect("ok");
        assert_eq!(t.restore("a", 7, &ok), Err(RestoreError::Duplicate));
        assert_eq!(
            t.restore("b", 7, &ok),
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
            t.insert(shard, &mut table, hash, record);
        }
        let table = read(&shard.table);
        let first = table.find(hash, b"first", read).expect("first");
        assert_eq!(record::version(&first), 3);
        drop(first);
        let second = table.find(hash, b"second", read).expect("second");
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

    #[test]
    fn size_classes_follow_jemalloc() {
        let cases = [
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (100, 112),
            (128, 128),
            (129, 160),
            (200, 224),
            (257, 320),
            (4097, 5120),
            (1 << 20, 1 << 20),
        ];
        for (n, class) in cases {
            assert_eq!(size_class(n), class, "{n}");
        }
    }

    #[test]
    fn index_bytes_matches_hashbrown_capacity() {
        let mut index: HashTable<u64> = HashTable::new();
        assert_eq!(index_bytes(&index), 0);
        for n in 0..100u64 {
            index.insert_unique(n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n, |&e| {
                e.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            });
        }
        // 100 entries need 128 buckets: 128 * 8 + 128 + 16 bytes.
        assert_eq!(index.capacity(), 112);
        assert_eq!(index_bytes(&index), size_class(128 * 8 + 128 + 16));
    }

    #[test]
    fn shard_is_one_cache_line_and_table_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<BoxTable>();
        assert_eq!(std::mem::size_of::<Shard>() % 64, 0);
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }
}
