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
//!
//! # Where things are
//!
//! This file is the table and its locking. The rest, one job a file:
//! `reduce.rs` (the reducers: one message applied to a box's state),
//! `record.rs` (the byte layout of a record), `codec.rs` (the compact field
//! state encoding), `size.rs` (the allocator size-class model the accounting
//! uses).

pub(crate) mod codec;
mod record;
mod reduce;
mod size;

pub use size::size_class;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// seen whole (its lock is held while its record is copied), but boxes
    /// created or updated during the walk may or may not be seen.
    ///
    /// `f` runs with no lock held: the records of up to [`WALK_BATCH`] slots are
    /// copied under the shard's read lock, the lock is let go, and only then are
    /// they decoded and handed to `f` (which writes a file). A shard lock is so
    /// held for the time of a few small copies, never for a write: a box
    /// creation (shard write lock), and the polls that queue behind it in std's
    /// RwLock, never wait on the disk.
    pub fn for_each(&self, mut f: impl FnMut(&str, u64, &[FieldState])) {
        let n = self.plan.fields.len();
        let mut states: Vec<FieldState> = Vec::with_capacity(n);
        let mut key = String::new();
        let mut copied: Vec<u8> = Vec::with_capacity(WALK_BATCH * 128);
        let mut ends: Vec<usize> = Vec::with_capacity(WALK_BATCH);
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
                            ends.push(copied.len());
                        }
                    }
                    next = stop;
                    if ends.is_empty() && stop == table.index.len() {
                        break;
                    }
                }
                let mut start = 0;
                for &end in &ends {
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
                    f(&key, record::version(record), &states);
                }
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
        t.apply(key, values, None)
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
            walker.for_each(|key, version, _| {
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
    fn shard_is_one_cache_line_and_table_is_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<BoxTable>();
        assert_eq!(std::mem::size_of::<Shard>() % 64, 0);
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }
}
