//! The snapshot reader: a file read into a box table, newest file of a chain
//! first, every part of it checked (the head, the field layout, each record,
//! the counts, the log position, the checksum) and every damage refused with
//! its own [`SnapshotError`]; and a single file read whole into a new table.
//!
//! What it is not: the finding and ordering of a chain's files on disk (the
//! server's `snapshot_file`), or the writing (`write`).

use std::io::Read;
use std::sync::Arc;

use super::chain::{Kind, Link, Newer};
use super::crc::{read_some, CrcReader};
use super::error::SnapshotError;
use super::format::{
    describe, layout, BASE_FLAG, BOX_MARKER, END_MARKER, FORMAT_VERSION, FORMAT_WITHOUT_CHAIN,
    FORMAT_WITHOUT_LIFECYCLE, FORMAT_WITHOUT_POSITION, MAGIC, MAX_FIELDS, MAX_PARTITIONS,
    MAX_STATE, REMOVED_MARKER,
};
use crate::boxes::codec;
use crate::boxes::{BoxTable, RestoreError};
use crate::log::Position;
use crate::plan::Plan;
use crate::render::FieldState;

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
    /// Its checksum (the one [`write_snapshot_at`](super::write_snapshot_at) returned).
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
    let mut base = std::collections::BTreeMap::new();
    for _ in 0..n {
        let at = r.offset;
        let flagged = r.u32()?;
        let partition = (flagged & !BASE_FLAG) as i32;
        let offset = r.u64()? as i64;
        if flagged & BASE_FLAG != 0 {
            base.insert(partition, r.u64()?);
        }
        if partition < 0 || offset < 0 || next.insert(partition, offset).is_some() {
            return Err(r.corrupt_at(at, "bad log position"));
        }
    }
    Ok(Some(Position { topic, next, base }))
}
