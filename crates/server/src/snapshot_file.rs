//! Snapshot files: the file I/O around the core's snapshot format
//! (`pollbox_core::snapshot`, which only reads and writes byte streams).
//!
//! This module owns the chain on disk (docs/operations.md#snapshots-and-durability):
//! the base at `path` and its deltas at `path.d00000001`, `path.d00000002`,
//! ...; when to write a delta and when a new base (compaction); the atomic
//! save of each file (temp file, fsync, rename, fsync the directory); the
//! seal of a graceful stop; the load at start; the start-up check that the
//! directory is writable; and the thread that writes every `interval_s`.
//!
//! Why every crash leaves a chain that loads to a state the node had: a file
//! is only ever seen whole (renamed once written and fsynced); a delta is
//! renamed after every file it builds on; a new base is renamed over the old
//! one before the old chain's deltas are removed, and those name the old
//! chain, so a reader skips them until they are gone. The newest file read is
//! the state loaded: the last one completed, never a part of the next.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pollbox_core::boxes::BoxTable;
use pollbox_core::log::Position;
use pollbox_core::snapshot::{
    read_link, read_link_into, write_link, Kind, Link, Newer, SnapshotError, Versions, Written,
    FORMAT_VERSION,
};

use crate::failpoint;
use crate::log::LogState;
use crate::start_error::StartError;
use pollbox_core::service::Node;

/// By default, a new base is written once the chain's deltas together pass this share of
/// its base's bytes (a compaction): with 1 % of the boxes changing between
/// snapshots that is a base every ~25 snapshots, about 5 % of a full snapshot
/// written per interval, and a restart reads at most 1.25 times a base's
/// bytes (deltas are read newest first, and a box a newer file holds is
/// skipped in the older ones, so each box is restored once). A restart costs
/// about 1.2 times a full snapshot's load with deltas of 15 % (measured:
/// benches/snapshot/incremental.sh), so half would cost more than the 1.2x
/// the cost is held to; a tenth would write about as much as full snapshots.
pub(crate) const COMPACT_PERCENT: u64 = 25;
/// A new base is written after this many deltas whatever their size, so a
/// restart reads a bounded number of files.
pub(crate) const MAX_DELTAS: u32 = 256;

/// The chain the next file extends: its base and its newest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    /// The chain's number (in every file of it).
    pub id: u64,
    /// The newest file's number: 0 the base, then its deltas.
    pub seq: u32,
    pub base_bytes: u64,
    /// The deltas' bytes together.
    pub delta_bytes: u64,
    /// The newest file's checksum (what a seal names).
    pub newest_crc: u32,
    /// The newest file's log position and version floor: a delta that would
    /// change neither and hold no box is not written.
    pub position: Option<Position>,
    pub floor: u64,
}

impl Chain {
    /// Whether the next file is to be a new base, with compactions at
    /// `percent` of the base's bytes.
    fn compaction_due(&self, percent: u32) -> bool {
        self.delta_bytes * 100 >= self.base_bytes * u64::from(percent) || self.seq >= MAX_DELTAS
    }
}

/// What [`Snapshots::save`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Saved {
    pub kind: Kind,
    /// Bytes written (0: a delta with nothing to say, not written).
    pub bytes: u64,
    /// The checksum of the chain's newest file now (what a seal names).
    pub newest_crc: u32,
}

/// The snapshot thread's figures, for metrics: files written and failed,
/// their bytes, the bases among them, and the time spent writing them. (The
/// final snapshot of a graceful stop is not counted.)
#[derive(Debug, Default)]
pub(crate) struct SnapshotStats {
    /// Snapshots written / failed.
    ok: AtomicUsize,
    failed: AtomicUsize,
    /// Bytes of the snapshot files written (bases and deltas), and the bases
    /// among them (compactions included).
    bytes: AtomicU64,
    bases: AtomicUsize,
    /// Microseconds spent writing snapshot files (walk, write, fsync, rename),
    /// failed ones included.
    write_us: AtomicU64,
}

impl SnapshotStats {
    /// A snapshot written in `took`.
    pub(crate) fn record_write(&self, took: Duration, saved: &Saved) {
        self.add_time(took);
        self.ok.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(saved.bytes, Ordering::Relaxed);
        if saved.kind == Kind::Base {
            self.bases.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A snapshot that failed after `took`.
    pub(crate) fn record_failure(&self, took: Duration) {
        self.add_time(took);
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn add_time(&self, took: Duration) {
        self.write_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Snapshots written.
    pub(crate) fn written(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    /// Snapshots that failed.
    pub(crate) fn failed(&self) -> usize {
        self.failed.load(Ordering::Relaxed)
    }

    /// Bytes of the snapshot files written (bases and deltas).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Bases written (the first, and every compaction of a chain of deltas).
    pub(crate) fn bases(&self) -> usize {
        self.bases.load(Ordering::Relaxed)
    }

    /// Seconds spent writing snapshot files (counted in microseconds).
    pub(crate) fn write_seconds(&self) -> f64 {
        self.write_us.load(Ordering::Relaxed) as f64 / 1e6
    }
}

/// The snapshots at `path`: writes the next file of the chain.
#[derive(Debug)]
pub(crate) struct Snapshots {
    path: PathBuf,
    /// `None`: the next file is a base (no chain yet, versions re-stamped at
    /// the load, or a write failed).
    chain: Option<Chain>,
    /// `snapshot.compact_percent` ([`COMPACT_PERCENT`] unless set).
    compact_percent: u32,
}

impl Snapshots {
    /// The snapshots at `path`, extending `chain` (what [`load`] found), or
    /// starting with a base.
    pub(crate) fn new(path: PathBuf, chain: Option<Chain>) -> Snapshots {
        Snapshots {
            path,
            chain,
            compact_percent: COMPACT_PERCENT as u32,
        }
    }

    /// Compactions once the deltas pass `percent` of the base's bytes (0: a
    /// base every time).
    pub(crate) fn compact_at(mut self, percent: u32) -> Snapshots {
        self.compact_percent = percent;
        self
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    #[cfg(test)]
    pub(crate) fn chain(&self) -> Option<&Chain> {
        self.chain.as_ref()
    }

    /// Write the next file of the chain for `table` at `now_ms` (the table's
    /// clock), with the log `position` it reflects at least (taken before this
    /// call): a delta, or a base when none is extended or the deltas passed
    /// its share of it (`compact_at`). After an error the next file is a base.
    pub(crate) fn save(
        &mut self,
        table: &BoxTable,
        now_ms: u64,
        position: Option<&Position>,
    ) -> io::Result<Saved> {
        let r = match self.chain.take() {
            Some(c) if !c.compaction_due(self.compact_percent) => {
                self.save_delta(c, table, now_ms, position)
            }
            _ => self.save_base(table, now_ms, position),
        };
        if r.is_err() {
            self.chain = None;
        }
        r
    }

    fn save_base(
        &mut self,
        table: &BoxTable,
        now_ms: u64,
        position: Option<&Position>,
    ) -> io::Result<Saved> {
        let link = Link {
            kind: Kind::Base,
            chain: new_chain_id(),
            seq: 0,
            wall_ms: crate::clock::wall_ms(),
        };
        let (written, bytes) = write_atomic(
            &self.path,
            "base",
            |w| write_link(table, now_ms, &link, position, w),
            |_| true,
        )?
        .ok_or_else(|| io::Error::other("a base is always kept"))?;
        // The old chain's deltas: skipped by readers from the rename on
        // (they name the old chain), removed now.
        let mut pruned = false;
        for (_, p) in delta_files(&self.path, true)? {
            match fs::remove_file(&p) {
                Ok(()) => pruned = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            failpoint::hit("snapshot:", "base-pruning");
        }
        if pruned {
            File::open(parent_dir(&self.path))?.sync_all()?;
        }
        self.chain = Some(Chain {
            id: link.chain,
            seq: 0,
            base_bytes: bytes,
            delta_bytes: 0,
            newest_crc: written.crc,
            position: position.cloned(),
            floor: written.floor,
        });
        Ok(Saved {
            kind: Kind::Base,
            bytes,
            newest_crc: written.crc,
        })
    }

    fn save_delta(
        &mut self,
        mut chain: Chain,
        table: &BoxTable,
        now_ms: u64,
        position: Option<&Position>,
    ) -> io::Result<Saved> {
        let link = Link {
            kind: Kind::Delta,
            chain: chain.id,
            seq: chain.seq + 1,
            wall_ms: crate::clock::wall_ms(),
        };
        let same = |w: &Written| {
            w.boxes == 0
                && w.removed == 0
                && w.floor == chain.floor
                && position == chain.position.as_ref()
        };
        let kept = write_atomic(
            &delta_path(&self.path, link.seq),
            "delta",
            |w| write_link(table, now_ms, &link, position, w),
            |w| !same(w),
        )?;
        let bytes = match kept {
            None => 0,
            Some((written, bytes)) => {
                chain.seq = link.seq;
                chain.delta_bytes += bytes;
                chain.newest_crc = written.crc;
                chain.position = position.cloned();
                chain.floor = written.floor;
                bytes
            }
        };
        let newest_crc = chain.newest_crc;
        self.chain = Some(chain);
        Ok(Saved {
            kind: Kind::Delta,
            bytes,
            newest_crc,
        })
    }
}

/// A chain number: random, never 0 (the chain of a file before format 5).
fn new_chain_id() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new()
        .hash_one(crate::clock::wall_us())
        .max(1)
}

/// The file under `path` counting what reaches it, that aborts at the
/// `-partial` failpoint of its step once the first bytes did.
struct Counted {
    file: File,
    bytes: u64,
    step: &'static str,
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.bytes += n as u64;
        if n > 0 && self.bytes == n as u64 {
            failpoint::hit("snapshot:", partial(self.step));
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn partial(step: &str) -> &'static str {
    match step {
        "base" => "base-partial",
        "delta" => "delta-partial",
        _ => "seal-partial",
    }
}

/// Write `path` through `write`: `path.tmp`, fsync it, then, if `keep` says
/// so, rename it over `path` and fsync the directory (else remove it).
/// `step` names the failpoints on the way (`snapshot:<step>-partial`,
/// `-synced`, `-renamed`). On error the temp file is removed. Returns what
/// `write` returned and the bytes written, `None` when not kept.
fn write_atomic<T>(
    path: &Path,
    step: &'static str,
    write: impl FnOnce(&mut BufWriter<Counted>) -> io::Result<T>,
    keep: impl FnOnce(&T) -> bool,
) -> io::Result<Option<(T, u64)>> {
    let tmp = suffixed(path, ".tmp");
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(
            1 << 16,
            Counted {
                file,
                bytes: 0,
                step,
            },
        );
        let done = write(&mut w)?;
        let counted = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        if !keep(&done) {
            drop(counted);
            fs::remove_file(&tmp)?;
            return Ok(None);
        }
        counted.file.sync_all()?;
        failpoint::hit("snapshot:", synced(step));
        let bytes = counted.bytes;
        drop(counted);
        fs::rename(&tmp, path)?;
        failpoint::hit("snapshot:", renamed(step));
        File::open(parent_dir(path))?.sync_all()?;
        Ok(Some((done, bytes)))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn synced(step: &str) -> &'static str {
    match step {
        "base" => "base-synced",
        "delta" => "delta-synced",
        _ => "seal-synced",
    }
}

fn renamed(step: &str) -> &'static str {
    match step {
        "base" => "base-renamed",
        "delta" => "delta-renamed",
        _ => "seal-renamed",
    }
}

/// `path` with `.tmp` appended (`boxes.snap` → `boxes.snap.tmp`).
#[cfg(test)]
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    suffixed(path, ".tmp")
}

/// `path` with `.sealed` appended: the seal of the snapshot at `path`.
pub(crate) fn seal_path(path: &Path) -> PathBuf {
    suffixed(path, ".sealed")
}

/// Delta `seq` of the chain whose base is `path` (`boxes.snap.d00000001`).
pub(crate) fn delta_path(path: &Path, seq: u32) -> PathBuf {
    suffixed(path, &format!(".d{seq:08}"))
}

/// The delta files beside the base `path`, by number (with `tmp`, their
/// temp files too, which a crash may have left).
fn delta_files(path: &Path, tmp: bool) -> io::Result<Vec<(u32, PathBuf)>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.d");
    let mut found = Vec::new();
    for entry in fs::read_dir(parent_dir(path))? {
        let entry = entry?;
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let (digits, is_tmp) = match rest.strip_suffix(".tmp") {
            Some(d) => (d, true),
            None => (rest, false),
        };
        if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) || (is_tmp && !tmp) {
            continue;
        }
        if let Ok(seq) = digits.parse() {
            found.push((seq, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

const SEAL_HEAD: &str = "pollbox snapshot seal, crc32 ";

/// Seal the snapshot at `path` whose newest file's checksum is `crc`
/// ([`Saved::newest_crc`]), written once every worker had stopped: nothing
/// was served past its versions, so the next start keeps them (and the ETags
/// clients hold stay true). Written atomically.
pub(crate) fn seal(path: &Path, crc: u32) -> io::Result<()> {
    write_atomic(
        &seal_path(path),
        "seal",
        |w| w.write_all(format!("{SEAL_HEAD}{crc:08x}\n").as_bytes()),
        |_| true,
    )
    .map(|_| ())
}

/// Remove the seal of the snapshot at `path`, if any, durably (before
/// anything is served: a crash from then on must find the snapshot unsealed).
pub(crate) fn unseal(path: &Path) -> io::Result<()> {
    match fs::remove_file(seal_path(path)) {
        Ok(()) => File::open(parent_dir(path))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The checksum the seal of the snapshot at `path` names, if it has one (a
/// seal that cannot be read or parsed counts as none: the versions are then
/// re-stamped, which is always safe).
fn sealed_crc(path: &Path) -> Option<u32> {
    let text = fs::read_to_string(seal_path(path)).ok()?;
    u32::from_str_radix(text.strip_prefix(SEAL_HEAD)?.trim_end(), 16).ok()
}

/// A table loaded from a snapshot.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub table: BoxTable,
    /// The log position it holds (none: a standalone node's).
    pub position: Option<Position>,
    /// The chain the next snapshot extends (`None`: the next is a base).
    pub chain: Option<Chain>,
    /// Files read: the base and its deltas.
    #[cfg(test)]
    pub files: usize,
}

/// Load the snapshot at `path` (its base, then its deltas: the chain on
/// disk) into a table from `new_table` (empty, with the clock the server
/// gives new versions) at `now_ms` (the table's clock): `Ok(None)` when there
/// is none (first start), an error for anything else that keeps it from
/// loading whole. A table with a version clock (a standalone node) keeps the
/// snapshot's versions only when its seal names the chain's newest file;
/// otherwise they are re-stamped past the clock, and the next snapshot is a
/// new base (docs/boxes.md#versions-and-etags). A node of a log keeps them:
/// they are log positions.
pub(crate) fn load(
    new_table: impl Fn() -> BoxTable,
    now_ms: u64,
    path: &Path,
) -> Result<Option<Loaded>, SnapshotError> {
    let Some((format, base)) = peek(path)? else {
        if let Some((_, p)) = delta_files(path, false)?.first() {
            return Err(SnapshotError::OutOfChain(format!(
                "{} is a delta and its base {} is missing; move the deltas \
                 ({}.d*) away too to start empty",
                p.display(),
                path.display(),
                path.display()
            )));
        }
        return Ok(None);
    };
    if base.kind != Kind::Base {
        return Err(SnapshotError::OutOfChain(format!(
            "{} is delta {} of a chain, not a base",
            path.display(),
            base.seq
        )));
    }
    // The deltas of its chain, in order; another chain's are an older
    // chain's, left by a crash before they were removed.
    let mut deltas = Vec::new();
    if format == FORMAT_VERSION {
        for (seq, p) in delta_files(path, false)? {
            let Some((_, link)) = peek(&p)? else {
                continue;
            };
            if link.chain != base.chain {
                continue;
            }
            if link.kind != Kind::Delta || link.seq != seq {
                return Err(SnapshotError::OutOfChain(format!(
                    "{} says it is file {} of its chain",
                    p.display(),
                    link.seq
                )));
            }
            if seq as usize != deltas.len() + 1 {
                return Err(SnapshotError::OutOfChain(format!(
                    "{} follows a missing delta {}",
                    p.display(),
                    deltas.len() + 1
                )));
            }
            deltas.push(p);
        }
    }
    let clocked = new_table().version_clock() != 0;
    let sealed = sealed_crc(path).filter(|_| clocked);
    let versions = match clocked && sealed.is_none() {
        true => Versions::Restamp,
        false => Versions::Keep,
    };
    let mut read = read_chain(&new_table, now_ms, path, &deltas, versions)?;
    if sealed.is_some_and(|crc| crc != read.newest_crc) {
        // The seal of another snapshot (files were replaced by hand since):
        // read it again, re-stamped.
        read = read_chain(&new_table, now_ms, path, &deltas, Versions::Restamp)?;
    }
    let keeps = !clocked || sealed == Some(read.newest_crc);
    let chain = (keeps && format == FORMAT_VERSION).then(|| Chain {
        id: base.chain,
        seq: deltas.len() as u32,
        base_bytes: read.base_bytes,
        delta_bytes: read.delta_bytes,
        newest_crc: read.newest_crc,
        position: read.position.clone(),
        floor: read.floor,
    });
    Ok(Some(Loaded {
        table: read.table,
        position: read.position,
        chain,
        #[cfg(test)]
        files: deltas.len() + 1,
    }))
}

struct ChainRead {
    table: BoxTable,
    position: Option<Position>,
    newest_crc: u32,
    floor: u64,
    base_bytes: u64,
    delta_bytes: u64,
}

/// Read the base `path` and its `deltas` (in order) newest first.
fn read_chain(
    new_table: &impl Fn() -> BoxTable,
    now_ms: u64,
    path: &Path,
    deltas: &[PathBuf],
    versions: Versions,
) -> Result<ChainRead, SnapshotError> {
    let table = new_table();
    let mut newer = Newer::default();
    let mut newest = None;
    let (mut floor, mut base_bytes, mut delta_bytes) = (0, 0, 0);
    for p in deltas
        .iter()
        .rev()
        .chain(std::iter::once(&path.to_path_buf()))
    {
        let file = File::open(p)?;
        let bytes = file.metadata()?.len();
        let mut r = BufReader::with_capacity(1 << 16, file);
        let read = read_link_into(&table, now_ms, versions, &mut newer, &mut r)?;
        floor = floor.max(read.floor);
        if read.link.kind == Kind::Base {
            base_bytes = bytes;
        } else {
            delta_bytes += bytes;
        }
        newest.get_or_insert((read.position, read.crc));
    }
    table.raise_version_floor(floor);
    let (position, newest_crc) = newest.unwrap_or((None, 0));
    Ok(ChainRead {
        table,
        position,
        newest_crc,
        floor,
        base_bytes,
        delta_bytes,
    })
}

/// The format and link of the file at `path`, `None` when there is none.
fn peek(path: &Path) -> Result<Option<(u32, Link)>, SnapshotError> {
    match File::open(path) {
        Ok(f) => read_link(&mut BufReader::with_capacity(64, f)).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The directory `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Refuse to start when the snapshot cannot be written later.
pub(crate) fn check_dir(path: &Path) -> Result<(), StartError> {
    let dir = parent_dir(path);
    let probe = dir.join(format!(".pollbox-write-test-{}", std::process::id()));
    match File::create(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(StartError::Snapshot {
            path: path.display().to_string(),
            reason: format!("directory {} is not writable: {e}", dir.display()),
        }),
    }
}

/// What the snapshot thread reads and counts, handed to it by the server:
/// the boxes, where the node stands in its log, the server's clock, and the
/// figures it keeps for `/metrics`.
pub(crate) struct Writing {
    /// The box table to save and the config (`snapshot.interval_s`).
    pub node: Arc<Node>,
    /// Where the node stands in its log (`[log]` set): the position a
    /// snapshot stores; its presence also picks the table's clock.
    pub log: Option<Arc<LogState>>,
    /// The write-ahead file (`[wal]` set): the position a snapshot stores,
    /// and the segments it covers, deleted once it is written.
    pub wal: Option<Arc<crate::wal::Wal>>,
    /// The server's clock starts here.
    pub started: Instant,
    /// Shared with `/metrics`.
    pub stats: Arc<SnapshotStats>,
}

impl Writing {
    /// The table's clock now ([`crate::clock::table_clock`]).
    fn table_now_ms(&self) -> u64 {
        let now_ms = self.started.elapsed().as_millis() as u64;
        crate::clock::table_clock(self.log.is_some() || self.wal.is_some(), now_ms)
    }
}

/// The snapshot thread: save every `snapshot.interval_s` until `stop` is set,
/// then hand the snapshots back (the final snapshot is
/// [`crate::Server::shutdown`]'s).
pub(crate) fn writer_loop(
    writing: Writing,
    stop: Arc<(Mutex<bool>, Condvar)>,
    mut snapshots: Snapshots,
) -> Snapshots {
    lower_priority();
    let every = Duration::from_secs(writing.node.config.snapshot.interval_s);
    let (lock, cv) = &*stop;
    let Ok(mut stopped) = lock.lock() else {
        return snapshots;
    };
    // `stop` may have been set before this thread first took the lock (a
    // quick shutdown on a busy machine): check before every wait, or the
    // notification is lost and shutdown waits a whole interval to join.
    while !*stopped {
        let (guard, _) = match cv.wait_timeout(stopped, every) {
            Ok(r) => r,
            Err(_) => return snapshots,
        };
        stopped = guard;
        if *stopped {
            return snapshots;
        }
        save_counted(&writing, &mut snapshots);
    }
    snapshots
}

/// Write the next snapshot file, counted in the metrics. Returns the chain's
/// newest checksum.
pub(crate) fn save_counted(writing: &Writing, snapshots: &mut Snapshots) -> Option<u32> {
    // The position first: the walk then sees every record before it.
    let position = match &writing.wal {
        Some(w) => Some(w.position()),
        None => writing.log.as_ref().and_then(|l| l.position()),
    };
    let began = Instant::now();
    let saved = snapshots.save(
        &writing.node.boxes,
        writing.table_now_ms(),
        position.as_ref(),
    );
    match saved {
        Ok(saved) => {
            writing.stats.record_write(began.elapsed(), &saved);
            // Durable now: the segments it covers are no longer needed.
            if let (Some(w), Some(p)) = (&writing.wal, &position) {
                w.snapshot_covers(p);
            }
            Some(saved.newest_crc)
        }
        Err(e) => {
            writing.stats.record_failure(began.elapsed());
            eprintln!(
                "pollbox: snapshot to {} failed: {e}",
                snapshots.path().display()
            );
            None
        }
    }
}

/// The snapshot thread runs at nice 19: on a core it shares with a worker, it
/// gets what the worker leaves. (Not SCHED_IDLE: the walk holds a shard's read
/// lock for a few copies at a time, and a thread that may never be scheduled
/// again while holding it would stall every box creation in that shard.)
fn lower_priority() {
    crate::thread_priority::lower_priority("snapshot");
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollbox_core::plan::Plan;

    #[test]
    fn the_snapshot_thread_runs_at_nice_19() {
        let nice = std::thread::spawn(|| {
            lower_priority();
            // SAFETY: as in lower_priority; getpriority only reads.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
        assert_eq!(nice, 19);
        // SAFETY: as above.
        let mine = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        assert_ne!(mine, 19, "only the snapshot thread");
    }
    use pollbox_core::plan::Value;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pollbox-snapshot-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// `boxes` boxes of the default plan, every field set on some.
    fn sample(boxes: usize) -> BoxTable {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        for k in 0..boxes as i64 {
            let by = format!("p-{k}");
            let values = [
                Some(Value::I64(k)),
                Some(Value::I64(-k)),
                None,
                (k % 2 == 0).then_some(Value::Str(&by)),
            ];
            t.apply(&format!("box-{k}"), &values, 0, None)
                .expect("applies");
        }
        t
    }

    /// Every box of `a` is in `b` with the same version and payload, and
    /// nothing else is.
    fn assert_same_boxes(a: &BoxTable, b: &BoxTable) {
        assert_eq!(a.len(), b.len());
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        a.for_each(0, |key, version, _, _| {
            pa.clear();
            pb.clear();
            assert_eq!(a.poll(key.as_bytes(), &mut pa), Some(version));
            assert_eq!(b.poll(key.as_bytes(), &mut pb), Some(version), "{key}");
            assert_eq!(pa, pb, "{key}");
        });
    }

    fn plain() -> BoxTable {
        BoxTable::new(Arc::new(Plan::default_plan()))
    }

    fn load_plain(path: &Path) -> Loaded {
        load(plain, 0, path).expect("loads").expect("exists")
    }

    #[test]
    fn a_base_then_deltas_load_to_the_table_they_were_written_from() {
        let dir = scratch_dir("chain");
        let path = dir.join("boxes.snap");
        assert!(load(plain, 0, &path).expect("no file is fine").is_none());
        let position = |o| Position {
            topic: "t".into(),
            next: [(0, o)].into_iter().collect(),
            base: Default::default(),
        };
        let t = sample(200);
        t.track_changes();
        let mut snaps = Snapshots::new(path.clone(), None);
        let base = snaps.save(&t, 0, Some(&position(9))).expect("saves");
        assert_eq!(base.kind, Kind::Base);
        assert!(!tmp_path(&path).exists(), "temp file renamed away");
        let loaded = load_plain(&path);
        assert_eq!(loaded.position, Some(position(9)));
        assert_eq!(loaded.files, 1);
        assert_same_boxes(&t, &loaded.table);

        // Changes, removals, a box removed and created again, one removed
        // for good: each delta holds only them.
        t.apply("box-1", &[Some(Value::I64(77)), None, None, None], 0, None)
            .expect("ok");
        t.remove(b"box-2").expect("present");
        t.remove(b"box-3").expect("present");
        t.apply("box-3", &[Some(Value::I64(5)), None, None, None], 0, None)
            .expect("ok");
        t.apply("new", &[], 0, None).expect("ok");
        let delta = snaps.save(&t, 0, Some(&position(12))).expect("saves");
        assert_eq!(delta.kind, Kind::Delta);
        assert!(delta.bytes * 20 < base.bytes, "{delta:?} against {base:?}");
        assert!(delta_path(&path, 1).exists());
        t.remove(b"new").expect("present");
        snaps.save(&t, 0, Some(&position(13))).expect("saves");
        assert!(delta_path(&path, 2).exists());
        // Nothing changed: no file.
        let same = snaps.save(&t, 0, Some(&position(13))).expect("saves");
        assert_eq!((same.kind, same.bytes), (Kind::Delta, 0));
        assert!(!delta_path(&path, 3).exists());

        let loaded = load_plain(&path);
        assert_eq!(loaded.files, 3);
        assert_eq!(loaded.position, Some(position(13)));
        assert_same_boxes(&t, &loaded.table);
        assert_eq!(loaded.table.version(b"box-2"), None);
        assert_eq!(loaded.table.version(b"new"), None);
        assert_eq!(loaded.table.version_floor(), t.version_floor());
        // The chain is handed on: the next file is delta 3.
        let chain = loaded.chain.expect("a chain to extend");
        assert_eq!((chain.seq, chain.position), (2, Some(position(13))));
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Twelve snapshots of `t` (100 boxes) at `path` after a first, 10
    /// boxes changing before each, each loaded back and compared: their kinds.
    fn twelve_rounds(snaps: &mut Snapshots, t: &BoxTable, path: &Path) -> Vec<Kind> {
        let mut kinds = Vec::new();
        for round in 0..12i64 {
            for k in 0..10 {
                let key = format!("box-{}", (round * 10 + k) % 100);
                t.apply(&key, &[Some(Value::I64(round))], 0, None)
                    .expect("ok");
            }
            kinds.push(snaps.save(t, 0, None).expect("saves").kind);
            assert_same_boxes(t, &load_plain(path).table);
        }
        kinds
    }

    #[test]
    fn deltas_past_a_quarter_of_the_base_start_a_new_base_and_the_old_deltas_go() {
        let dir = scratch_dir("compact");
        let path = dir.join("boxes.snap");
        let t = sample(100);
        let mut snaps = Snapshots::new(path.clone(), None);
        assert_eq!(snaps.save(&t, 0, None).expect("saves").kind, Kind::Base);
        let kinds = twelve_rounds(&mut snaps, &t, &path);
        let first_base = kinds
            .iter()
            .position(|k| *k == Kind::Base)
            .expect("compacted");
        assert!(first_base >= 3, "{kinds:?}");
        let chain = snaps.chain().expect("a chain").clone();
        let on_disk = delta_files(&path, true).expect("lists");
        assert_eq!(
            on_disk.len(),
            chain.seq as usize,
            "only the new chain's deltas"
        );
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// The kinds of thirteen snapshots (a first, then [`twelve_rounds`]),
    /// compacting at `percent`.
    fn kinds_at(percent: u32) -> Vec<Kind> {
        let dir = scratch_dir(&format!("compact-at-{percent}"));
        let path = dir.join("boxes.snap");
        let t = sample(100);
        let mut snaps = Snapshots::new(path.clone(), None).compact_at(percent);
        let mut kinds = vec![snaps.save(&t, 0, None).expect("saves").kind];
        kinds.extend(twelve_rounds(&mut snaps, &t, &path));
        fs::remove_dir_all(&dir).expect("cleanup");
        kinds
    }

    #[test]
    fn the_compaction_share_is_a_setting() {
        let bases = |k: &[Kind]| k.iter().filter(|k| **k == Kind::Base).count();
        // 0: a full snapshot every time.
        assert_eq!(bases(&kinds_at(0)), 13);
        // Deltas of about 10 % of the base each: the lower the share, the
        // more bases.
        let (ten, default, all) = (
            bases(&kinds_at(10)),
            bases(&kinds_at(COMPACT_PERCENT as u32)),
            bases(&kinds_at(100)),
        );
        assert!(ten > default && default > all, "{ten} {default} {all}");
        assert_eq!(
            all, 2,
            "one compaction past 100 % in twelve deltas of ~10 %"
        );
    }

    #[test]
    fn a_crash_between_a_new_base_and_pruning_the_old_deltas_skips_them() {
        let dir = scratch_dir("stale");
        let path = dir.join("boxes.snap");
        let t = sample(50);
        let mut snaps = Snapshots::new(path.clone(), None);
        snaps.save(&t, 0, None).expect("base");
        t.remove(b"box-7").expect("present");
        snaps.save(&t, 0, None).expect("delta 1");
        let old_delta = fs::read(delta_path(&path, 1)).expect("delta 1");
        // A new chain (its base says box-7 is there again), and the old
        // chain's delta 1 put back as a crash before pruning leaves it.
        t.apply("box-7", &[], 0, None).expect("ok");
        let mut fresh = Snapshots::new(path.clone(), None);
        fresh.save(&t, 0, None).expect("new base");
        assert!(!delta_path(&path, 1).exists(), "pruned");
        fs::write(delta_path(&path, 1), &old_delta).expect("write");
        let loaded = load_plain(&path);
        assert_eq!(loaded.files, 1, "another chain's delta is skipped");
        assert_same_boxes(&t, &loaded.table);
        // A temp file a crash left is no delta.
        fs::write(tmp_path(&delta_path(&path, 1)), b"half").expect("write");
        assert_eq!(load_plain(&path).files, 1);
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_missing_delta_or_a_missing_base_is_refused() {
        let dir = scratch_dir("missing-link");
        let path = dir.join("boxes.snap");
        let t = sample(20);
        let mut snaps = Snapshots::new(path.clone(), None);
        snaps.save(&t, 0, None).expect("base");
        for k in 0..2 {
            t.apply(&format!("box-{k}"), &[], 0, None).expect("ok");
            snaps.save(&t, 0, None).expect("delta");
        }
        fs::remove_file(delta_path(&path, 1)).expect("rm");
        let e = load(plain, 0, &path).expect_err("refused");
        assert!(e.to_string().contains("follows a missing delta 1"), "{e}");
        fs::remove_file(&path).expect("rm");
        let e = load(plain, 0, &path).expect_err("refused");
        assert!(e.to_string().contains("its base"), "{e}");
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_format_4_file_loads_as_a_base_and_the_next_snapshot_is_a_new_base() {
        let dir = scratch_dir("format4");
        let path = dir.join("boxes.snap");
        let t = sample(30);
        let position = Position {
            topic: "t".into(),
            next: [(0, 3)].into_iter().collect(),
            base: Default::default(),
        };
        let mut f = BufWriter::new(File::create(&path).expect("create"));
        pollbox_core::snapshot::write_snapshot_at(&t, 0, Some(&position), &mut f).expect("writes");
        drop(f);
        let loaded = load_plain(&path);
        assert_eq!(loaded.position, Some(position));
        assert!(
            loaded.chain.is_none(),
            "a file of format 4 is extended by no delta"
        );
        assert_same_boxes(&t, &loaded.table);
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_damaged_file_is_an_error_not_an_empty_start() {
        let dir = scratch_dir("damaged");
        let path = dir.join("boxes.snap");
        let t = sample(20);
        let mut snaps = Snapshots::new(path.clone(), None);
        snaps.save(&t, 0, None).expect("base");
        t.apply("box-1", &[], 0, None).expect("ok");
        snaps.save(&t, 0, None).expect("delta");
        for file in [delta_path(&path, 1), path.clone()] {
            let good = fs::read(&file).expect("read");
            let mut bytes = good.clone();
            bytes.truncate(bytes.len() / 2 + 1);
            fs::write(&file, &bytes).expect("write");
            assert!(matches!(
                load(plain, 0, &path),
                Err(SnapshotError::Truncated { .. })
            ));
            fs::write(&file, &good).expect("write");
        }
        assert_same_boxes(&t, &load_plain(&path).table);
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    fn clock() -> u64 {
        1_000_000
    }

    #[test]
    fn a_clocked_table_keeps_versions_only_of_the_snapshot_its_seal_names() {
        let dir = scratch_dir("seal");
        let path = dir.join("boxes.snap");
        let clocked = || BoxTable::with_version_clock(Arc::new(Plan::default_plan()), clock);
        let version = |t: &BoxTable| t.version(b"box-0").expect("restored");
        let t = sample(3);
        let before = version(&t);
        assert!(before < clock());
        let mut snaps = Snapshots::new(path.clone(), None);
        snaps.save(&t, 0, None).expect("base");
        t.apply("box-1", &[], 0, None).expect("ok");
        let crc = snaps.save(&t, 0, None).expect("delta").newest_crc;

        // Unsealed (a crash, or a periodic snapshot): past the clock, and
        // the next snapshot starts a new base.
        let loaded = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&loaded.table), clock() + 1);
        assert!(loaded.chain.is_none());
        // A table without a clock (a node of a log): as written.
        assert_eq!(version(&load_plain(&path).table), before);

        // Sealed at a graceful stop: as written, and the chain goes on.
        seal(&path, crc).expect("seals");
        assert!(!tmp_path(&seal_path(&path)).exists());
        let loaded = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&loaded.table), before);
        assert_eq!(loaded.chain.map(|c| c.seq), Some(1));
        // The seal of another file (the base's, an older state) does not count.
        seal(&path, crc ^ 1).expect("seals");
        let loaded = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&loaded.table), clock() + 1);

        // Unsealed at start: the next load re-stamps again.
        seal(&path, crc).expect("seals");
        unseal(&path).expect("unseals");
        assert!(!seal_path(&path).exists());
        unseal(&path).expect("no seal is fine");
        let loaded = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&loaded.table), clock() + 1);
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_save_into_a_missing_directory_fails_cleanly() {
        let dir = scratch_dir("missing");
        let path = dir.join("no/such/dir/boxes.snap");
        let t = sample(1);
        let mut snaps = Snapshots::new(path.clone(), None);
        assert!(snaps.save(&t, 0, None).is_err());
        assert!(snaps.chain().is_none());
        assert!(!tmp_path(&path).exists());
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn unwritable_snapshot_directory_is_refused() {
        let e = check_dir(Path::new("/proc/no-such-dir/x.snap")).unwrap_err();
        assert!(e.to_string().contains("not writable"), "{e}");
        assert!(check_dir(&std::env::temp_dir().join("x.snap")).is_ok());
    }
}
