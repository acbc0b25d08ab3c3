//! Box table snapshots (docs/operations.md#snapshots-and-durability): the binary
//! format and its checks, written to any `Write` and read from any `Read`. Files
//! (the chain of a base and its deltas on disk, the atomic save, the load at
//! start) are the server's: `pollbox_server::snapshot_file`.
//!
//! A snapshot is a **chain**: a base (every box) and deltas (the boxes written
//! and the keys removed since the file before, [`Walk`]), each a file of
//! format 5, little endian throughout:
//!
//! ```text
//! magic "PBOXSNAP" | format u32 (= 5) | kind u8 (0 base, 1 delta) | chain u64 | seq u32 | wall_ms u64
//! field count u32 | per field: name_len u16, name, type u8, reduce u8
//! per box:     1u8 | key_len u16, key | version u64 | idle_s u32 | state_len u32, state
//! per removal: 2u8 | key_len u16, key                                   (deltas only)
//! end:         0u8 | box count u64 | removal count u64 | version floor u64
//!              | topic_len u16, topic | partition count u32 | per partition: partition i32, next offset i64
//!              | CRC-32 (IEEE) u32 of every byte before it
//! ```
//!
//! `chain` names the base every file of the chain builds on (a random number
//! drawn when the base is written), `seq` is 0 for the base and 1, 2, ... for
//! its deltas, `wall_ms` the wall clock at the write (a box a delta does not
//! hold has been idle since the file that holds it, longer by the time
//! between the two). A chain is read newest file first ([`read_link_into`]):
//! the first state of a key that a file gives wins, older ones are skipped,
//! and a key a newer file removed is skipped in older ones, so every box is
//! restored once, from the newest file that holds it.
//!
//! Formats 4 and 3 were one file, a base with no chain (the layout above
//! without kind, chain, seq, wall_ms and removal count); 4 ends with the log
//! position, 3 has none. Both are still read, as a base; 4 is still written by
//! [`write_snapshot_at`] (tools and tests).
//!
//! The log position (formats 4 and 5) is where a node of a Kafka log stands:
//! the next offset to read in each partition of `topic` (`topic_len` 0: a
//! standalone node's snapshot, no position). It is taken *before* the walk,
//! so the boxes reflect at least every record before it; records applied
//! during the walk are read again at a restart and skipped by their version
//! (`BoxTable::apply_logged`), so none is applied twice. A delta holds the
//! position of the state it completes, so the newest file's is the chain's.
//!
//! `state` holds one entry per field in the box table's own field-state encoding
//! (`boxes/codec.rs`: a tag, then a varint, 8 bytes or a string), so records and
//! snapshots share one codec. The version floor is the highest version a removed
//! box served, so a key created again after a restart still starts past it
//! (docs/boxes.md#incarnations); it is read after the walk, so a box removed before
//! the walk reached it is in the floor if it is not in the file; `idle_s` is how
//! long the box had accepted no message, so its ttl runs on after a restart instead
//! of starting over. Format 2 had neither: it is still read (floor 0, every box
//! fresh). Format 1 wrote fixed-width values instead; it is refused as an
//! unsupported version. Only boxes in the table are written: a deleted or expired
//! box is gone from it at once. Boxes are streamed, so a snapshot of a million
//! boxes needs no second copy in memory, and the count is written at the end
//! because boxes may be created during the walk.
//!
//! The field list is compared with the configuration's names, types and
//! reducers: a snapshot written with another layout is refused, never
//! reinterpreted. Every damage is refused with its own [`SnapshotError`].

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::sync::Arc;

use std::collections::HashMap;

use crate::boxes::codec;
use crate::boxes::{BoxTable, RestoreError, Walk};
use crate::config::{FieldType, Reduce};
use crate::log::Position;
use crate::plan::Plan;
use crate::render::FieldState;

const MAGIC: &[u8; 8] = b"PBOXSNAP";
/// The snapshot format this build writes and reads: a base or a delta of a chain.
pub const FORMAT_VERSION: u32 = 5;
/// The older formats this build still reads, as a base: 4 is one file with no
/// chain, 3 has no log position either, 2 no version floor and idle times
/// either.
const FORMAT_WITHOUT_CHAIN: u32 = 4;
const FORMAT_WITHOUT_POSITION: u32 = 3;
const FORMAT_WITHOUT_LIFECYCLE: u32 = 2;
/// Bounds that keep a corrupted count from asking for gigabytes.
const MAX_PARTITIONS: u32 = 1 << 20;
/// Bounds that keep a corrupted length from asking for gigabytes.
const MAX_FIELDS: u32 = 4096;
/// A box's encoded state is at most its payload (at most 64 KiB) plus a few
/// bytes a field, so 1 MiB is far above any real one.
const MAX_STATE: u32 = 1 << 20;

const BOX_MARKER: u8 = 1;
const REMOVED_MARKER: u8 = 2;
const END_MARKER: u8 = 0;

/// What a file of a snapshot chain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every box.
    Base,
    /// The boxes written and the keys removed since the file before.
    Delta,
}

/// Where a file stands in its chain (the head of a format-5 file; a file of
/// format 4 or older reads as a base of chain 0 written at wall_ms 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub kind: Kind,
    /// The chain: drawn when its base is written, carried by its deltas.
    pub chain: u64,
    /// 0 for the base, then 1, 2, ... for its deltas in order.
    pub seq: u32,
    /// The wall clock (ms since the Unix epoch) when the file was written.
    pub wall_ms: u64,
}

/// What [`write_link`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The file's checksum (what a seal names).
    pub crc: u32,
    pub boxes: u64,
    pub removed: u64,
    /// The version floor written.
    pub floor: u64,
}

/// Why a snapshot was not loaded. Each says what is wrong with the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("not a pollbox snapshot (bad magic bytes)")]
    BadMagic,
    #[error("snapshot format version {found} is not supported (this build reads versions {FORMAT_WITHOUT_LIFECYCLE} to {FORMAT_VERSION})")]
    UnsupportedVersion { found: u32 },
    #[error("snapshot is truncated (it ends at byte {offset})")]
    Truncated { offset: u64 },
    #[error("snapshot checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupted")]
    ChecksumMismatch { stored: u32, computed: u32 },
    #[error("snapshot is corrupted at byte {offset}: {what}")]
    Corrupt { offset: u64, what: &'static str },
    #[error(
        "snapshot was written with a different field layout: snapshot has [{snapshot}], \
         config has [{config}]; restore the old [[boxes.field]] list or move the snapshot away"
    )]
    LayoutMismatch { snapshot: String, config: String },
    #[error("snapshot box {key:?} does not fit the current config: {reason}")]
    BoxRefused { key: String, reason: RestoreError },
    #[error("snapshot file does not belong where it lies: {0}")]
    OutOfChain(String),
}

/// Write every box of `table` to `w` at `now_ms` (the clock the table's
/// expiry counts on). Boxes are written one by one, each whole; pass a
/// buffered writer.
pub fn write_snapshot(table: &BoxTable, now_ms: u64, w: &mut impl Write) -> io::Result<()> {
    write_snapshot_at(table, now_ms, None, w).map(|_| ())
}

/// [`write_snapshot`] with the log position the boxes reflect at least
/// (taken before the walk). Returns the snapshot's checksum (what a seal
/// names: docs/operations.md#snapshots-and-durability).
pub fn write_snapshot_at(
    table: &BoxTable,
    now_ms: u64,
    position: Option<&Position>,
    w: &mut impl Write,
) -> io::Result<u32> {
    let mut file = FileWriter::start(w, &encode_head(table.plan(), None)?)?;
    let mut count = 0u64;
    table.for_each(now_ms, |key, version, idle_s, state| {
        if file.put(|record| encode_box(key, version, idle_s, state, record)) {
            count += 1;
        }
    });
    file.finish(|end| {
        end.push(END_MARKER);
        end.extend_from_slice(&count.to_le_bytes());
        // After the walk: every box removed before it saw the box's shard is in it.
        end.extend_from_slice(&table.version_floor().to_le_bytes());
        encode_position(position, end)
    })
}

/// Write one file of a chain (format 5): with [`Kind::Base`] every box of
/// `table`, with [`Kind::Delta`] the boxes written and the keys removed since
/// the walk before ([`BoxTable::walk`]: every walk, base or delta, starts a
/// new generation of changes, so call this for every file of the chain, in
/// order, and start a new base after a write that failed). `position` is the
/// log position the boxes reflect at least (taken before this call). Pass a
/// buffered writer.
pub fn write_link(
    table: &BoxTable,
    now_ms: u64,
    link: &Link,
    position: Option<&Position>,
    w: &mut impl Write,
) -> io::Result<Written> {
    let file = FileWriter::start(w, &encode_head(table.plan(), Some(link))?)?;
    let (mut boxes, mut removed) = (0u64, 0u64);
    // Both callbacks write to the file.
    let file = std::cell::RefCell::new(file);
    let which = match link.kind {
        Kind::Base => Walk::All,
        Kind::Delta => Walk::Changed,
    };
    table.walk(
        now_ms,
        which,
        |key| {
            let put = file.borrow_mut().put(|record| {
                record.push(REMOVED_MARKER);
                record.extend_from_slice(&len_u16(key.len())?.to_le_bytes());
                record.extend_from_slice(key.as_bytes());
                Ok(())
            });
            if put {
                removed += 1;
            }
        },
        |key, version, idle_s, state| {
            let put = file
                .borrow_mut()
                .put(|record| encode_box(key, version, idle_s, state, record));
            if put {
                boxes += 1;
            }
        },
    );
    let mut floor = 0;
    let crc = file.into_inner().finish(|end| {
        floor = table.version_floor();
        end.push(END_MARKER);
        end.extend_from_slice(&boxes.to_le_bytes());
        end.extend_from_slice(&removed.to_le_bytes());
        // After the walk: every box removed before it saw the box's shard is in it.
        end.extend_from_slice(&floor.to_le_bytes());
        encode_position(position, end)
    })?;
    Ok(Written {
        crc,
        boxes,
        removed,
        floor,
    })
}

/// The head of a file: the magic, the format (5 with the link it stands at
/// in a chain, 4 without) and the field layout.
fn encode_head(plan: &Plan, link: Option<&Link>) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(64);
    head.extend_from_slice(MAGIC);
    match link {
        None => head.extend_from_slice(&FORMAT_WITHOUT_CHAIN.to_le_bytes()),
        Some(link) => {
            head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            head.push(match link.kind {
                Kind::Base => 0,
                Kind::Delta => 1,
            });
            head.extend_from_slice(&link.chain.to_le_bytes());
            head.extend_from_slice(&link.seq.to_le_bytes());
            head.extend_from_slice(&link.wall_ms.to_le_bytes());
        }
    }
    encode_layout(plan, &mut head)?;
    Ok(head)
}

fn encode_layout(plan: &Plan, head: &mut Vec<u8>) -> io::Result<()> {
    head.extend_from_slice(&len_u32(plan.fields.len())?.to_le_bytes());
    for (name, ty, reduce) in layout(plan) {
        head.extend_from_slice(&len_u16(name.len())?.to_le_bytes());
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(&[ty, reduce]);
    }
    Ok(())
}

fn encode_position(position: Option<&Position>, log: &mut Vec<u8>) -> io::Result<()> {
    match position {
        None => log.extend_from_slice(&0u16.to_le_bytes()),
        Some(p) => {
            if p.topic.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a log position needs its topic",
                ));
            }
            log.extend_from_slice(&len_u16(p.topic.len())?.to_le_bytes());
            log.extend_from_slice(p.topic.as_bytes());
            log.extend_from_slice(&len_u32(p.next.len())?.to_le_bytes());
            for (partition, next) in &p.next {
                log.extend_from_slice(&partition.to_le_bytes());
                log.extend_from_slice(&next.to_le_bytes());
            }
        }
    }
    Ok(())
}

fn encode_box(
    key: &str,
    version: u64,
    idle_s: u32,
    state: &[FieldState],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    out.push(BOX_MARKER);
    out.extend_from_slice(&len_u16(key.len())?.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&idle_s.to_le_bytes());
    // The length goes before the state; fill it in once the state is written.
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    for s in state {
        codec::encode(s.view(), out);
    }
    let len = len_u32(out.len() - len_at - 4)?;
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

fn len_u16(n: usize) -> io::Result<u16> {
    u16::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "length over 65535"))
}

fn len_u32(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "length over 2^32"))
}

/// The field layout as stored: name, type code, reducer code.
fn layout(plan: &Plan) -> impl Iterator<Item = (&str, u8, u8)> {
    plan.fields.iter().map(|f| {
        let ty = match f.ty {
            FieldType::I64 => 0,
            FieldType::F64 => 1,
            FieldType::Bool => 2,
            FieldType::Str => 3,
        };
        let reduce = match f.reduce {
            Reduce::Last => 0,
            Reduce::Sum => 1,
            Reduce::Min => 2,
            Reduce::Max => 3,
            Reduce::Count => 4,
        };
        (f.name.as_str(), ty, reduce)
    })
}

/// `v:i64/last, n:count, ...`, for layout mismatch messages.
fn describe(fields: &[(String, u8, u8)]) -> String {
    let mut s = String::new();
    for (i, (name, ty, reduce)) in fields.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let ty = ["i64", "f64", "bool", "str"]
            .get(*ty as usize)
            .unwrap_or(&"?");
        let reduce = ["last", "sum", "min", "max", "count"]
            .get(*reduce as usize)
            .unwrap_or(&"?");
        if *reduce == "count" {
            let _ = write!(s, "{name}:count");
        } else {
            let _ = write!(s, "{name}:{ty}/{reduce}");
        }
    }
    s
}

/// Read a snapshot into a new table for `plan` at `now_ms` (the clock the
/// table's expiry will count on). Nothing is trusted before the checksum at
/// the end matches: a box the configuration refuses is reported only if the
/// file is otherwise intact (a damaged file says so instead).
pub fn read_snapshot(
    plan: Arc<Plan>,
    now_ms: u64,
    r: &mut impl Read,
) -> Result<BoxTable, SnapshotError> {
    read_snapshot_at(plan, now_ms, r).map(|(table, _)| table)
}

/// [`read_snapshot`] with the log position the snapshot holds (`None`: a
/// standalone node's, or a format before 4).
pub fn read_snapshot_at(
    plan: Arc<Plan>,
    now_ms: u64,
    r: &mut impl Read,
) -> Result<(BoxTable, Option<Position>), SnapshotError> {
    read_snapshot_into(BoxTable::new(plan), now_ms, Versions::Keep, r)
        .map(|s| (s.table, s.position))
}

/// What a snapshot's versions become when its boxes are restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versions {
    /// As written: nothing was served past them (a snapshot sealed at a
    /// graceful stop), or they are log positions, which a replay reproduces.
    Keep,
    /// Past the table's version clock (and past their own): the process that
    /// wrote the snapshot may have served later versions of a box before it
    /// stopped, with other content, so no version it may have served is
    /// reused (docs/boxes.md#versions-and-etags).
    Restamp,
}

/// A snapshot read whole.
pub struct Restored {
    pub table: BoxTable,
    /// The log position it holds (`None`: a standalone node's, or a format before 4).
    pub position: Option<Position>,
    /// Its checksum (the one [`write_snapshot_at`] returned).
    pub crc: u32,
}

/// Read a snapshot of one file into `table` (empty; the caller's, so that it
/// keeps the caller's version clock), its versions kept or re-stamped.
pub fn read_snapshot_into(
    table: BoxTable,
    now_ms: u64,
    versions: Versions,
    r: &mut impl Read,
) -> Result<Restored, SnapshotError> {
    let read = read_link_into(&table, now_ms, versions, &mut Newer::default(), r)?;
    table.raise_version_floor(read.floor);
    Ok(Restored {
        table,
        position: read.position,
        crc: read.crc,
    })
}

/// What the newer files of a chain, read already, settled for the older
/// ones: the keys they removed (and in which file), the wall clock of the
/// newest.
#[derive(Debug, Default)]
pub struct Newer {
    removed: HashMap<String, u32>,
    newest_wall_ms: Option<u64>,
}

/// What [`read_link_into`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    pub link: Link,
    /// The format it was written in (2 to 5).
    pub format: u32,
    pub position: Option<Position>,
    pub crc: u32,
    /// Its version floor: the caller raises the table's to the highest of a
    /// chain's ([`BoxTable::raise_version_floor`]).
    pub floor: u64,
    /// Boxes restored from it (not those a newer file held).
    pub restored: u64,
}

/// The head of a snapshot file: its format and where it stands in its chain
/// (a file before format 5 is a base of chain 0). Reads only the head.
pub fn read_link(r: &mut impl Read) -> Result<(u32, Link), SnapshotError> {
    let mut r = CrcReader {
        inner: r,
        crc: crc32fast::Hasher::new(),
        offset: 0,
    };
    read_head(&mut r)
}

fn read_head<R: Read>(r: &mut CrcReader<'_, R>) -> Result<(u32, Link), SnapshotError> {
    if r.array::<8>()? != *MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let found = r.u32()?;
    if ![
        FORMAT_VERSION,
        FORMAT_WITHOUT_CHAIN,
        FORMAT_WITHOUT_POSITION,
        FORMAT_WITHOUT_LIFECYCLE,
    ]
    .contains(&found)
    {
        return Err(SnapshotError::UnsupportedVersion { found });
    }
    let mut link = Link {
        kind: Kind::Base,
        chain: 0,
        seq: 0,
        wall_ms: 0,
    };
    if found == FORMAT_VERSION {
        let at = r.offset;
        link.kind = match r.u8()? {
            0 => Kind::Base,
            1 => Kind::Delta,
            _ => return Err(r.corrupt_at(at, "bad file kind")),
        };
        link.chain = r.u64()?;
        let at = r.offset;
        link.seq = r.u32()?;
        if (link.seq == 0) != (link.kind == Kind::Base) {
            return Err(r.corrupt_at(at, "file number does not fit its kind"));
        }
        link.wall_ms = r.u64()?;
    }
    Ok((found, link))
}

/// Read one file of a chain into `table`, the chain's files newest first:
/// a box the table holds already (from a newer file, or earlier in this
/// one) is skipped, as is one that a newer file removed; a removal is
/// recorded in `newer` for the older files. Idle times grow by the time
/// between this file and the newest. The version floor is returned, not
/// applied. Nothing is trusted before the checksum at the end matches: a box
/// the configuration refuses is reported only if the file is otherwise intact
/// (a damaged file says so instead); on an error the table holds part of the
/// file and is to be dropped.
pub fn read_link_into(
    table: &BoxTable,
    now_ms: u64,
    versions: Versions,
    newer: &mut Newer,
    r: &mut impl Read,
) -> Result<FileRead, SnapshotError> {
    let plan = table.plan();
    // Every version the writer may have served is below the clock now.
    let past = match versions {
        Versions::Keep => None,
        Versions::Restamp => Some(table.version_clock()),
    };
    let mut r = CrcReader {
        inner: r,
        crc: crc32fast::Hasher::new(),
        offset: 0,
    };
    let (found, link) = read_head(&mut r)?;
    let newest_wall_ms = *newer.newest_wall_ms.get_or_insert(link.wall_ms);
    let older_s =
        u32::try_from(newest_wall_ms.saturating_sub(link.wall_ms) / 1000).unwrap_or(u32::MAX);
    let lifecycle = found != FORMAT_WITHOUT_LIFECYCLE;
    let stored = read_layout(&mut r)?;
    let same_layout = stored.len() == plan.fields.len()
        && stored
            .iter()
            .zip(layout(plan))
            .all(|((n, t, r), (pn, pt, pr))| n == pn && *t == pt && *r == pr);
    let body = BoxReader {
        table,
        now_ms,
        link,
        past,
        older_s,
        same_layout,
        lifecycle,
        fields: stored.len(),
    }
    .read(&mut r, newer)?;
    let end = read_end(&mut r, found, lifecycle)?;
    let computed = r.crc.clone().finalize();
    let stored_crc = u32::from_le_bytes(r.array_unhashed::<4>()?);
    if stored_crc != computed {
        return Err(SnapshotError::ChecksumMismatch {
            stored: stored_crc,
            computed,
        });
    }
    if end.boxes != body.boxes || end.removals != body.removals {
        return Err(r.corrupt_at(end.at, "box count does not match the boxes read"));
    }
    let mut extra = [0u8; 1];
    if read_some(&mut r.inner, &mut extra)? != 0 {
        return Err(r.corrupt_at(r.offset, "bytes after the checksum"));
    }
    if !same_layout {
        return Err(SnapshotError::LayoutMismatch {
            snapshot: describe(&stored),
            config: describe(
                &layout(plan)
                    .map(|(n, t, r)| (n.to_string(), t, r))
                    .collect::<Vec<_>>(),
            ),
        });
    }
    match body.refused {
        Some(e) => Err(e),
        None => Ok(FileRead {
            link,
            format: found,
            position: end.position,
            crc: computed,
            floor: end.floor,
            restored: body.restored,
        }),
    }
}

/// The field layout a file was written with: each field's name, type and
/// reduction.
fn read_layout<R: Read>(r: &mut CrcReader<'_, R>) -> Result<Vec<(String, u8, u8)>, SnapshotError> {
    let at = r.offset;
    let n = r.u32()?;
    if n == 0 || n > MAX_FIELDS {
        return Err(r.corrupt_at(at, "field count out of range"));
    }
    let mut stored = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = r.u16()?;
        let at = r.offset;
        let name = String::from_utf8(r.bytes(len as usize)?)
            .map_err(|_| r.corrupt_at(at, "field name is not UTF-8"))?;
        let [ty, reduce] = r.array::<2>()?;
        stored.push((name, ty, reduce));
    }
    Ok(stored)
}

/// How the boxes of one file of a chain go into the table.
struct BoxReader<'t> {
    table: &'t BoxTable,
    now_ms: u64,
    link: Link,
    /// Restamp each version past this clock (`None`: keep them).
    past: Option<u64>,
    /// Seconds between this file and the newest, added to idle times.
    older_s: u32,
    /// The file's layout is the configuration's: without it nothing is
    /// restored, and the file is only checked.
    same_layout: bool,
    /// Each box carries its idle time (format 3 on).
    lifecycle: bool,
    /// Fields a box's state holds.
    fields: usize,
}

/// What [`BoxReader::read`] found between the layout and the end marker.
struct BoxesRead {
    boxes: u64,
    removals: u64,
    restored: u64,
    /// The first box the table refused; reported once the checksum vouches
    /// for the file.
    refused: Option<SnapshotError>,
}

impl BoxReader<'_> {
    /// The boxes and removals up to the end marker: each box restored unless
    /// a newer file holds or removed it, each removal noted in `newer`.
    fn read<R: Read>(
        &self,
        r: &mut CrcReader<'_, R>,
        newer: &mut Newer,
    ) -> Result<BoxesRead, SnapshotError> {
        let mut read = BoxesRead {
            boxes: 0,
            removals: 0,
            restored: 0,
            refused: None,
        };
        let mut state: Vec<FieldState> = Vec::with_capacity(self.fields);
        let mut state_bytes: Vec<u8> = Vec::new();
        loop {
            let at = r.offset;
            let marker = r.u8()?;
            match marker {
                END_MARKER => return Ok(read),
                BOX_MARKER => {}
                REMOVED_MARKER if self.link.kind == Kind::Delta => {}
                _ => return Err(r.corrupt_at(at, "bad box marker")),
            }
            let len = r.u16()?;
            let at = r.offset;
            let key = String::from_utf8(r.bytes(len as usize)?)
                .map_err(|_| r.corrupt_at(at, "box key is not UTF-8"))?;
            if marker == REMOVED_MARKER {
                read.removals += 1;
                // Unless a newer file (or this one: boxes follow the removals of
                // their shard) holds the key again.
                if self.table.version(key.as_bytes()).is_none() {
                    newer.removed.entry(key).or_insert(self.link.seq);
                }
                continue;
            }
            let version = r.u64()?;
            let idle_s = if self.lifecycle { r.u32()? } else { 0 };
            self.read_state(r, &mut state_bytes, &mut state)?;
            read.boxes += 1;
            // A box a newer file holds is refused by restore itself
            // (`Duplicate`, one probe, nothing rendered).
            let gone = !newer.removed.is_empty()
                && newer
                    .removed
                    .get(&key)
                    .is_some_and(|&seq| seq > self.link.seq);
            if self.same_layout && read.refused.is_none() && !gone {
                let version = self.past.map_or(version, |p| version.max(p) + 1);
                let idle_s = idle_s.saturating_add(self.older_s);
                match self
                    .table
                    .restore(&key, version, idle_s, &state, self.now_ms)
                {
                    Ok(()) => read.restored += 1,
                    // A newer state of the box was restored already.
                    Err(RestoreError::Duplicate) => {}
                    Err(reason) => read.refused = Some(SnapshotError::BoxRefused { key, reason }),
                }
            }
        }
    }

    /// One box's field states, decoded into `state` (`bytes` holds them as
    /// read).
    fn read_state<R: Read>(
        &self,
        r: &mut CrcReader<'_, R>,
        bytes: &mut Vec<u8>,
        state: &mut Vec<FieldState>,
    ) -> Result<(), SnapshotError> {
        let at = r.offset;
        let len = r.u32()?;
        if len > MAX_STATE {
            return Err(r.corrupt_at(at, "field state length out of range"));
        }
        bytes.resize(len as usize, 0);
        r.fill(bytes)?;
        let mut fields = codec::Decoder::new(bytes);
        state.clear();
        for _ in 0..self.fields {
            let view = fields
                .try_next()
                .ok_or_else(|| r.corrupt_at(at, "bad field state"))?;
            state.push(view.to_state());
        }
        if !fields.is_at_end() {
            return Err(r.corrupt_at(at, "bytes after the field states"));
        }
        Ok(())
    }
}

/// What follows the end marker, up to the checksum.
struct FileEnd {
    /// Where the counts start (what a count that does not match points to).
    at: u64,
    boxes: u64,
    removals: u64,
    floor: u64,
    position: Option<Position>,
}

/// The counts, the version floor and the log position of a file of format
/// `found`, each as far as that format has it.
fn read_end<R: Read>(
    r: &mut CrcReader<'_, R>,
    found: u32,
    lifecycle: bool,
) -> Result<FileEnd, SnapshotError> {
    let at = r.offset;
    let boxes = r.u64()?;
    let removals = if found == FORMAT_VERSION { r.u64()? } else { 0 };
    let floor = if lifecycle { r.u64()? } else { 0 };
    let position = if found >= FORMAT_WITHOUT_CHAIN {
        read_position(r)?
    } else {
        None
    };
    Ok(FileEnd {
        at,
        boxes,
        removals,
        floor,
        position,
    })
}

/// The log position the boxes reflect (`None` for a standalone node's).
fn read_position<R: Read>(r: &mut CrcReader<'_, R>) -> Result<Option<Position>, SnapshotError> {
    let len = r.u16()?;
    if len == 0 {
        return Ok(None);
    }
    let at = r.offset;
    let topic = String::from_utf8(r.bytes(len as usize)?)
        .map_err(|_| r.corrupt_at(at, "log topic is not UTF-8"))?;
    let at = r.offset;
    let n = r.u32()?;
    if n > MAX_PARTITIONS {
        return Err(r.corrupt_at(at, "partition count out of range"));
    }
    let mut next = std::collections::BTreeMap::new();
    for _ in 0..n {
        let at = r.offset;
        let partition = r.u32()? as i32;
        let offset = r.u64()? as i64;
        if partition < 0 || offset < 0 || next.insert(partition, offset).is_some() {
            return Err(r.corrupt_at(at, "bad log position"));
        }
    }
    Ok(Some(Position { topic, next }))
}

fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

struct CrcWriter<'w, W: Write> {
    inner: &'w mut W,
    crc: crc32fast::Hasher,
}

impl<W: Write> CrcWriter<'_, W> {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.crc.update(buf);
        self.inner.write_all(buf)
    }
}

/// A file being written: the records of a walk, one at a time, then its end
/// and checksum. A write that fails inside the walk (whose callbacks return
/// nothing) is kept, and the file ends with it.
struct FileWriter<'w, W: Write> {
    w: CrcWriter<'w, W>,
    record: Vec<u8>,
    failed: Option<io::Error>,
}

impl<'w, W: Write> FileWriter<'w, W> {
    fn start(inner: &'w mut W, head: &[u8]) -> io::Result<Self> {
        let mut w = CrcWriter {
            inner,
            crc: crc32fast::Hasher::new(),
        };
        w.write_all(head)?;
        Ok(FileWriter {
            w,
            record: Vec::with_capacity(256),
            failed: None,
        })
    }

    /// Write the record `encode` puts into an empty buffer. False when it was
    /// not written: it failed, or a write before it did.
    fn put(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.record.clear();
        match encode(&mut self.record).and_then(|()| self.w.write_all(&self.record)) {
            Ok(()) => true,
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }

    /// The first failed write, or else the end `encode` writes and then the
    /// checksum (not itself checksummed); returns the checksum.
    fn finish(mut self, encode: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> io::Result<u32> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.record.clear();
        encode(&mut self.record)?;
        self.w.write_all(&self.record)?;
        let crc = self.w.crc.clone().finalize();
        self.w.inner.write_all(&crc.to_le_bytes())?;
        self.w.inner.flush()?;
        Ok(crc)
    }
}

struct CrcReader<'r, R: Read> {
    inner: &'r mut R,
    crc: crc32fast::Hasher,
    offset: u64,
}

impl<R: Read> CrcReader<'_, R> {
    fn fill_unhashed(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        let mut done = 0;
        while done < buf.len() {
            match read_some(self.inner, &mut buf[done..])? {
                0 => {
                    return Err(SnapshotError::Truncated {
                        offset: self.offset + done as u64,
                    })
                }
                n => done += n,
            }
        }
        self.offset += buf.len() as u64;
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        self.fill_unhashed(buf)?;
        self.crc.update(buf);
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn array_unhashed<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut b = [0u8; N];
        self.fill_unhashed(&mut b)?;
        Ok(b)
    }

    fn bytes(&mut self, len: usize) -> Result<Vec<u8>, SnapshotError> {
        let mut b = vec![0u8; len];
        self.fill(&mut b)?;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn corrupt_at(&self, offset: u64, what: &'static str) -> SnapshotError {
        SnapshotError::Corrupt { offset, what }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{FieldPlan, Value};

    fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
        FieldPlan {
            name: name.into(),
            path: vec![name.into()],
            ty,
            reduce,
            max_len: if ty == FieldType::Str { 32 } else { 0 },
        }
    }

    fn every_type_plan() -> Plan {
        Plan {
            key_field: "key".into(),
            max_key_bytes: 128,
            max_payload_bytes: 256,
            max_boxes: 1000,
            ttl_s: 0,
            fields: vec![
                field("i", FieldType::I64, Reduce::Sum),
                field("f", FieldType::F64, Reduce::Max),
                field("b", FieldType::Bool, Reduce::Last),
                field("s", FieldType::Str, Reduce::Last),
                field("n", FieldType::I64, Reduce::Count),
            ],
        }
    }

    /// A table with `boxes` boxes plus one that never got a field, values
    /// chosen per field type (some absent) so every tag is written.
    fn sample(plan: Plan, boxes: usize) -> BoxTable {
        let t = BoxTable::new(Arc::new(plan));
        for k in 0..boxes {
            let key = format!("box-{k}-é");
            let s = format!("p\"{k}\n");
            for m in 0..(k % 3 + 1) {
                let values: Vec<_> = t
                    .plan()
                    .fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| match f.ty {
                        FieldType::I64 => Some(Value::I64(k as i64 * 1000 - m as i64)),
                        FieldType::F64 => (m != 1).then_some(Value::F64(k as f64 / 7.0)),
                        FieldType::Bool => Some(Value::Bool((k + i) % 2 == 0)),
                        FieldType::Str => (k % 4 != 0).then_some(Value::Str(&s)),
                    })
                    .collect();
                t.apply(&key, &values, 0, None).expect("sample applies");
            }
        }
        t.apply("sparse", &[], 0, None).expect("ok");
        t
    }

    fn bytes_of(t: &BoxTable) -> Vec<u8> {
        let mut out = Vec::new();
        write_snapshot(t, 0, &mut out).expect("writes to a Vec");
        out
    }

    fn dump(t: &BoxTable) -> Vec<(String, u64, Vec<FieldState>, Vec<u8>)> {
        let mut all = Vec::new();
        t.for_each(0, |k, v, _, s| {
            all.push((k.to_string(), v, s.to_vec(), Vec::new()))
        });
        for entry in &mut all {
            t.poll(entry.0.as_bytes(), &mut entry.3).expect("present");
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    #[test]
    fn round_trip_keeps_every_box_state_version_and_payload() {
        let t = sample(every_type_plan(), 50);
        let bytes = bytes_of(&t);
        let back =
            read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect("reads");
        assert_eq!(back.len(), 51);
        assert_eq!(dump(&back), dump(&t));
    }

    #[test]
    fn the_version_floor_and_idle_times_survive_a_round_trip() {
        let mut plan = Plan::default_plan();
        plan.ttl_s = 100;
        let plan = Arc::new(plan);
        let t = BoxTable::new(plan.clone());
        for _ in 0..3 {
            t.apply("gone", &[], 0, None).expect("ok");
        }
        t.apply("kept", &[], 0, None).expect("ok");
        t.apply("fresh", &[], 40_000, None).expect("ok");
        assert_eq!(t.remove(b"gone"), Some(3));
        let mut bytes = Vec::new();
        write_snapshot(&t, 50_000, &mut bytes).expect("writes");
        // A restarted process: its clock starts again at 0.
        let back = read_snapshot(plan, 0, &mut bytes.as_slice()).expect("reads");
        assert_eq!(back.len(), 2, "only live boxes");
        assert_eq!(back.version_floor(), 3);
        assert_eq!(back.apply("gone", &[], 0, None), Ok(4));
        let mut idle = Vec::new();
        back.for_each(0, |k, _, i, _| idle.push((k.to_string(), i)));
        idle.sort();
        assert_eq!(
            idle,
            [
                ("fresh".into(), 10),
                ("gone".into(), 0),
                ("kept".into(), 50)
            ]
        );
    }

    /// The same table in format 2 (no version floor, no idle times).
    fn format_2(t: &BoxTable) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&(t.plan().fields.len() as u32).to_le_bytes());
        for (name, ty, reduce) in layout(t.plan()) {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&[ty, reduce]);
        }
        let mut n = 0u64;
        t.for_each(0, |key, version, _, state| {
            out.push(BOX_MARKER);
            out.extend_from_slice(&(key.len() as u16).to_le_bytes());
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(&version.to_le_bytes());
            let mut st = Vec::new();
            for s in state {
                codec::encode(s.view(), &mut st);
            }
            out.extend_from_slice(&(st.len() as u32).to_le_bytes());
            out.extend_from_slice(&st);
            n += 1;
        });
        out.push(END_MARKER);
        out.extend_from_slice(&n.to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn format_2_is_still_read() {
        let t = sample(every_type_plan(), 20);
        let back = read_snapshot(Arc::new(every_type_plan()), 0, &mut format_2(&t).as_slice())
            .expect("reads format 2");
        assert_eq!(dump(&back), dump(&t));
        assert_eq!(back.version_floor(), 0);
    }

    #[test]
    fn the_log_position_survives_a_round_trip() {
        let t = sample(every_type_plan(), 20);
        let position = Position {
            topic: "scores".into(),
            next: [(0, 17), (1, 0), (7, 123_456_789_012)]
                .into_iter()
                .collect(),
        };
        let mut bytes = Vec::new();
        write_snapshot_at(&t, 0, Some(&position), &mut bytes).expect("writes");
        let (back, read) =
            read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect("reads");
        assert_eq!(dump(&back), dump(&t));
        assert_eq!(read, Some(position));
        // A standalone node's snapshot holds none.
        let (_, read) =
            read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes_of(&t).as_slice())
                .expect("reads");
        assert_eq!(read, None);
    }

    #[test]
    fn format_3_is_still_read() {
        // Format 3 is format 4 without the position (a standalone node's
        // format-4 file has an empty one: two zero bytes before the CRC).
        let t = sample(every_type_plan(), 20);
        let mut bytes = bytes_of(&t);
        bytes.truncate(bytes.len() - 4 - 2);
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let (back, position) =
            read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes.as_slice())
                .expect("reads format 3");
        assert_eq!(dump(&back), dump(&t));
        assert_eq!(position, None);
    }

    #[test]
    fn a_damaged_log_position_is_refused() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let position = Position {
            topic: "t".into(),
            next: [(0, 1)].into_iter().collect(),
        };
        let mut bytes = Vec::new();
        write_snapshot_at(&t, 0, Some(&position), &mut bytes).expect("writes");
        // The offset of partition 0 made negative, the checksum made right.
        let at = bytes.len() - 4 - 1;
        bytes[at] = 0x80;
        let body = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
        let e = read_snapshot_at(Arc::new(Plan::default_plan()), 0, &mut bytes.as_slice())
            .expect_err("refused");
        assert!(e.to_string().contains("bad log position"), "{e}");
    }

    fn link(kind: Kind, seq: u32, wall_ms: u64) -> Link {
        Link {
            kind,
            chain: 42,
            seq,
            wall_ms,
        }
    }

    fn file(t: &BoxTable, l: Link) -> Vec<u8> {
        let mut out = Vec::new();
        write_link(t, 0, &l, None, &mut out).expect("writes to a Vec");
        out
    }

    /// Read a chain's files (oldest first in `files`) the way a restart does:
    /// newest first into one table.
    fn read_chain(plan: Plan, files: &[Vec<u8>]) -> BoxTable {
        let t = BoxTable::new(Arc::new(plan));
        let mut newer = Newer::default();
        let mut floor = 0;
        for f in files.iter().rev() {
            let read = read_link_into(&t, 0, Versions::Keep, &mut newer, &mut f.as_slice())
                .expect("reads");
            floor = floor.max(read.floor);
        }
        t.raise_version_floor(floor);
        t
    }

    #[test]
    fn a_base_and_its_deltas_round_trip_with_removals_and_recreations() {
        let t = sample(every_type_plan(), 40);
        let base = file(&t, link(Kind::Base, 0, 0));
        let (_, l) = read_link(&mut base.as_slice()).expect("head");
        assert_eq!(l, link(Kind::Base, 0, 0));
        t.apply("box-1-é", &[None, None, None, None, None], 0, None)
            .expect("ok");
        t.remove("box-2-é".as_bytes()).expect("present");
        t.remove("box-3-é".as_bytes()).expect("present");
        t.apply("box-3-é", &[], 0, None).expect("created again");
        t.apply("new", &[], 0, None).expect("ok");
        let d1 = file(&t, link(Kind::Delta, 1, 0));
        assert!(d1.len() * 5 < base.len(), "{} of {}", d1.len(), base.len());
        t.remove(b"new").expect("present");
        t.remove("box-1-é".as_bytes()).expect("present");
        t.apply("box-1-é", &[], 0, None).expect("created again");
        let d2 = file(&t, link(Kind::Delta, 2, 0));
        // Nothing changed: an empty delta.
        let d3 = file(&t, link(Kind::Delta, 3, 0));
        let back = read_chain(every_type_plan(), &[base, d1, d2, d3]);
        assert_eq!(dump(&back), dump(&t));
        assert_eq!(back.version_floor(), t.version_floor());
    }

    #[test]
    fn a_box_a_delta_does_not_hold_ages_by_the_time_since_its_file() {
        let mut plan = Plan::default_plan();
        plan.ttl_s = 1000;
        let t = BoxTable::new(Arc::new(plan.clone()));
        t.apply("old", &[], 0, None).expect("ok");
        let base = file(&t, link(Kind::Base, 0, 1_000));
        t.apply("new", &[], 0, None).expect("ok");
        let d1 = file(&t, link(Kind::Delta, 1, 61_000));
        let back = read_chain(plan, &[base, d1]);
        let mut idle = Vec::new();
        back.for_each(0, |k, _, i, _| idle.push((k.to_string(), i)));
        idle.sort();
        assert_eq!(idle, [("new".into(), 0), ("old".into(), 60)]);
    }

    /// Writers update, create and remove boxes while a base and deltas are
    /// written: the chain read back is the table, once a last delta is
    /// written with the writers stopped (a change made during a walk is in
    /// that walk's file or in the next).
    #[test]
    fn no_change_made_during_a_walk_is_missed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (t, stop) = (t.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut x = w + 1;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = format!("k{}", x % 3000);
                        if x % 11 == 0 {
                            t.remove(key.as_bytes());
                        } else {
                            let v = [Some(Value::I64((x % 1000) as i64)), None, None, None];
                            t.apply(&key, &v, 0, None).expect("ok");
                        }
                    }
                })
            })
            .collect();
        while t.len() < 1000 {
            std::thread::yield_now();
        }
        let mut files = vec![file(&t, link(Kind::Base, 0, 0))];
        for seq in 1..30 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            files.push(file(&t, link(Kind::Delta, seq, 0)));
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().expect("writer");
        }
        files.push(file(&t, link(Kind::Delta, 30, 0)));
        let back = read_chain(Plan::default_plan(), &files);
        assert!(back.len() > 1000);
        assert_eq!(dump(&back), dump(&t));
    }

    #[test]
    fn every_truncation_or_flipped_byte_of_a_delta_is_refused() {
        let t = sample(every_type_plan(), 6);
        let base = file(&t, link(Kind::Base, 0, 0));
        t.remove("box-2-é".as_bytes()).expect("present");
        t.apply("box-1-é", &[], 0, None).expect("ok");
        let delta = file(&t, link(Kind::Delta, 1, 0));
        let read = |bytes: &[u8]| {
            let t = BoxTable::new(Arc::new(every_type_plan()));
            let mut newer = Newer::default();
            read_link_into(&t, 0, Versions::Keep, &mut newer, &mut &bytes[..]).and_then(|_| {
                read_link_into(&t, 0, Versions::Keep, &mut newer, &mut base.as_slice())
            })
        };
        assert!(read(&delta).is_ok());
        for len in 0..delta.len() {
            assert!(read(&delta[..len]).is_err(), "length {len}");
        }
        for at in 0..delta.len() {
            let mut bad = delta.clone();
            bad[at] ^= 0x01;
            assert!(read(&bad).is_err(), "byte {at}");
        }
    }

    #[test]
    fn empty_table_round_trips() {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        let bytes = bytes_of(&t);
        let back =
            read_snapshot(Arc::new(Plan::default_plan()), 0, &mut bytes.as_slice()).expect("reads");
        assert!(back.is_empty());
    }

    #[test]
    fn every_truncation_is_refused_as_truncated() {
        let bytes = bytes_of(&sample(every_type_plan(), 6));
        for len in 0..bytes.len() {
            match read_snapshot(Arc::new(every_type_plan()), 0, &mut &bytes[..len]) {
                Err(e @ SnapshotError::Truncated { .. }) => {
                    assert!(e.to_string().starts_with("snapshot is truncated"), "{e}")
                }
                Err(e) => panic!("length {len}: {e}"),
                Ok(_) => panic!("length {len} of {} was accepted", bytes.len()),
            }
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = bytes_of(&sample(every_type_plan(), 6));
        for at in 0..bytes.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= mask;
                if let Ok(t) = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()) {
                    panic!("byte {at} ^ {mask:#x} was accepted ({} boxes)", t.len());
                }
            }
        }
    }

    #[test]
    fn a_flipped_record_byte_says_checksum_mismatch() {
        let mut bytes = bytes_of(&sample(every_type_plan(), 6));
        // The last box ends with its count field (tag + one-byte varint: the
        // counts are small) just before the end marker, count, floor and CRC:
        // flipping a bit below its continuation bit is structurally fine, only
        // the CRC knows.
        let at = bytes.len() - 4 - 8 - 8 - 1 - 1;
        bytes[at] ^= 0x10;
        let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice())
            .expect_err("refused");
        assert!(
            e.to_string().starts_with("snapshot checksum mismatch"),
            "{e}"
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = bytes_of(&sample(every_type_plan(), 2));
        bytes.push(0);
        let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice())
            .expect_err("refused");
        assert!(
            matches!(
                e,
                SnapshotError::Corrupt {
                    what: "bytes after the checksum",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_magic_and_version_are_named() {
        let bytes = bytes_of(&sample(every_type_plan(), 1));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()).err();
        assert!(matches!(e, Some(SnapshotError::BadMagic)), "{e:?}");
        let mut bad = bytes.clone();
        bad[8] = 9;
        let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()).err();
        assert!(
            matches!(e, Some(SnapshotError::UnsupportedVersion { found: 9 })),
            "{e:?}"
        );
    }

    #[test]
    fn another_field_layout_is_refused_with_both_layouts_named() {
        let bytes = bytes_of(&sample(Plan::default_plan(), 3));
        let mut changes: Vec<Plan> = Vec::new();
        let mut p = Plan::default_plan();
        p.fields[1].reduce = Reduce::Max;
        changes.push(p);
        let mut p = Plan::default_plan();
        p.fields[3].name = "player".into();
        changes.push(p);
        let mut p = Plan::default_plan();
        p.fields.swap(0, 1);
        changes.push(p);
        let mut p = Plan::default_plan();
        p.fields.pop();
        changes.push(p);
        let mut p = Plan::default_plan();
        p.fields[0].ty = FieldType::F64;
        changes.push(p);
        for plan in changes {
            let e = read_snapshot(Arc::new(plan), 0, &mut bytes.as_slice()).expect_err("refused");
            let msg = e.to_string();
            assert!(matches!(e, SnapshotError::LayoutMismatch { .. }), "{msg}");
            assert!(
                msg.contains("snapshot has [v:i64/last, sum:i64/sum, n:count, by:str/last]"),
                "{msg}"
            );
        }
        // max_len, paths and limits are not part of the layout.
        let mut p = Plan::default_plan();
        p.fields[3].max_len = 64;
        p.fields[0].path = vec!["other".into()];
        assert_eq!(
            read_snapshot(Arc::new(p), 0, &mut bytes.as_slice())
                .expect("same layout")
                .len(),
            4
        );
    }

    #[test]
    fn boxes_the_config_refuses_are_reported() {
        let bytes = bytes_of(&sample(Plan::default_plan(), 3));
        let mut p = Plan::default_plan();
        p.max_boxes = 2;
        let e = read_snapshot(Arc::new(p), 0, &mut bytes.as_slice()).expect_err("refused");
        assert!(
            matches!(
                e,
                SnapshotError::BoxRefused {
                    reason: RestoreError::TooManyBoxes { max: 2 },
                    ..
                }
            ),
            "{e}"
        );
        let mut p = Plan::default_plan();
        p.max_payload_bytes = 20;
        let e = read_snapshot(Arc::new(p), 0, &mut bytes.as_slice()).expect_err("refused");
        assert!(
            e.to_string()
                .contains("payload over max_payload_bytes (20)"),
            "{e}"
        );
    }
}
