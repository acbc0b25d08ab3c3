//! The start of a node with a write-ahead file: after the snapshot, every
//! record past the position it holds is applied again, in file order, at
//! the version its sequence number gives, so the boxes and their versions
//! are the ones that were served. A torn tail (a crash in the middle of a
//! write: nothing in it was acknowledged) is cut off and logged; damage
//! before the end refuses the start, naming the file, the offset and the
//! fix. `pollbox check-config` runs the same reading without cutting.
//!
//! What it is not: the format ([`pollbox_core::wal`]), or the rules of a
//! record ([`Replica`]).

use super::writer::{record_of, sync_dir};
use pollbox_core::boxes::BoxTable;
use pollbox_core::log::Replica;
use pollbox_core::wal::{parse_segment_name, read_segment, WalRecord};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the file held.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// Segments on disk after recovery: (first sequence number, bytes).
    pub segments: Vec<(u64, u64)>,
    /// The sequence number of the last record (0: none).
    pub last_seq: u64,
    /// Records applied again (past the snapshot's position).
    pub replayed: u64,
    /// Records the snapshot already held.
    pub covered: u64,
    /// A torn tail found (and cut off when repairing): what was said of it.
    pub torn: Option<String>,
}

/// Read the segments in `dir` and apply every record at or past `from`
/// (the snapshot's position; 0: all) to `boxes`. `repair`: cut a torn tail
/// off (a start) or only report it (`check-config`). An error is the
/// message that refuses the start.
pub(crate) fn recover(
    dir: &Path,
    boxes: &BoxTable,
    plan: &Arc<pollbox_core::plan::Plan>,
    arena_limit_bytes: usize,
    from: u64,
    repair: bool,
) -> Result<Recovered, String> {
    let mut replica = Replica::new(plan.clone(), arena_limit_bytes, 1);
    let mut key = Vec::new();
    read_records(dir, from, repair, |path, rec| {
        let outcome = replica.apply(boxes, &record_of(rec), &mut key, &mut ());
        if let pollbox_core::log::Outcome::Invalid(e) = &outcome {
            // Checked as an ingest before it was written: a record the
            // rules refuse now was written under another [boxes]
            // config. Skipped as the log skips an invalid record.
            eprintln!(
                "pollbox: wal: {} record {}: skipped ({})",
                path.display(),
                rec.seq,
                e.describe(boxes.plan())
            );
        }
    })
}

/// Read the segments in `dir` and hand every record at or past `from` to
/// `each`, in file order, with its segment's path; the torn tail and damage
/// as [`recover`] says. `pollbox migrate` reads the file this way too.
pub(crate) fn read_records(
    dir: &Path,
    from: u64,
    repair: bool,
    mut each: impl FnMut(&Path, &WalRecord<'_>),
) -> Result<Recovered, String> {
    let mut out = Recovered::default();
    let mut names = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                parse_segment_name(&name).map(|first| (first, e.path()))
            })
            .collect::<Vec<(u64, PathBuf)>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !repair => return Ok(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)
                .and_then(|()| sync_dir(dir.parent().unwrap_or(Path::new("."))))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            return Ok(out);
        }
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    names.sort();
    let count = names.len();
    for (i, (first, path)) in names.into_iter().enumerate() {
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (last, damage) = read_segment(&bytes, out.last_seq, |rec| {
            if rec.seq < from {
                out.covered += 1;
                return;
            }
            each(&path, rec);
            out.replayed += 1;
        });
        out.last_seq = last;
        let mut len = bytes.len() as u64;
        if let Some(d) = damage {
            let last_segment = i + 1 == count;
            if !(d.torn && last_segment) {
                return Err(format!(
                    "{} is damaged at offset {} ({}): the records from there on cannot be \
                     read. To start with the records before it, cut the file there \
                     (truncate -s {} {}) and move the later segments of {} away: the \
                     messages after it are then lost (restore the directory from a backup \
                     to keep them)",
                    path.display(),
                    d.offset,
                    d.damage,
                    d.offset,
                    path.display(),
                    dir.display()
                ));
            }
            let said = format!(
                "{}: a torn record at offset {} ({}, {} bytes to the end: a write the crash \
                 cut short, never acknowledged)",
                path.display(),
                d.offset,
                d.damage,
                len - d.offset
            );
            if repair {
                cut(&path, d.offset).map_err(|e| format!("cannot cut {}: {e}", path.display()))?;
                eprintln!("pollbox: wal: {said}: cut off");
                len = d.offset;
            }
            out.torn = Some(said);
        }
        if repair && len < pollbox_core::wal::SEGMENT_MAGIC.len() as u64 {
            // Nothing of it was written: the next segment takes its place.
            std::fs::remove_file(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            continue;
        }
        out.segments.push((first, len));
    }
    Ok(out)
}

/// Cut the file at `path` to `len` bytes, durably.
fn cut(path: &Path, len: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_all()
}
