//! The snapshot writer: a file of a chain (a base or a delta, format 5) or a
//! single file (format 4) written from a walk of the box table, each box and
//! removal as one record, the counts, the version floor and the log position
//! at the end, then the checksum.
//!
//! What it is not: where the file goes and how it is made durable (the
//! server's `snapshot_file`), or the reading (`read`).

use std::io::{self, Write};

use super::chain::{Kind, Link};
use super::crc::CrcWriter;
use super::format::{
    layout, BASE_FLAG, BOX_MARKER, END_MARKER, FORMAT_VERSION, FORMAT_WITHOUT_CHAIN, MAGIC,
    REMOVED_MARKER,
};
use crate::boxes::codec;
use crate::boxes::{BoxTable, Walk};
use crate::log::Position;
use crate::plan::Plan;
use crate::render::FieldState;

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
                // A partition with a base (a migrated topic's) has the high
                // bit set and its base after the offset.
                let base = p.base.get(partition).copied().filter(|&b| b > 0);
                let flag = if base.is_some() { BASE_FLAG } else { 0 };
                log.extend_from_slice(&(*partition as u32 | flag).to_le_bytes());
                log.extend_from_slice(&next.to_le_bytes());
                if let Some(b) = base {
                    log.extend_from_slice(&b.to_le_bytes());
                }
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
