//! The write-ahead file's two threads. `pollbox-wal` takes what the workers
//! appended since its last turn, writes it to the current segment in one
//! `write` and syncs it (`fdatasync`): while it writes and syncs, the
//! workers append the next group, so one sync covers every record written
//! meanwhile by every worker (group commit), and a lone message waits about
//! one sync. `pollbox-wal-apply` then applies the synced records in file
//! order (the log's [`Replica`]: a record's version is its sequence number)
//! and reports each to its waiting connection, one wake-up a worker a group.
//!
//! Faults: a write that finds the disk full is taken back (the file cut to
//! where it was), its records reported failed (their ingests answer 503
//! `disk full`, none half-acknowledged) and the next group tried afresh, so
//! ingest resumes once space returns. A failed sync stops the file for
//! good: what the kernel held may be gone while the page cache says it is
//! there, so the sync is never tried again as if the data were safe; the
//! node turns unready and says why.
//!
//! What it is not: the queue the workers append to ([`super::Wal`]).

use super::{Wal, FAULTS};
use crate::log::DeliveryTag;
use crate::log::PassReports;
use crate::wakeups::Wakeups;
use pollbox_core::log::{Record, Replica, Report};
use pollbox_core::service::Node;
use pollbox_core::wal::{decode, decode_values, segment_name, SEGMENT_MAGIC};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// What the threads are handed.
pub(crate) struct Writing {
    pub node: Arc<Node>,
    pub wal: Arc<Wal>,
    pub wakeups: Arc<Wakeups>,
}

/// A synced group, for the applying thread.
struct Synced {
    bytes: Vec<u8>,
    tags: Vec<DeliveryTag>,
    /// The records' projected messages ([`super::Queue::values`]).
    values: Vec<u8>,
}

/// The threads, joined by [`Threads::join`] after [`Wal::stop`].
pub(crate) struct Threads {
    write: JoinHandle<()>,
    apply: JoinHandle<()>,
}

impl Threads {
    pub(crate) fn join(self) {
        let _ = self.write.join();
        let _ = self.apply.join();
    }
}

/// Start the writing and the applying thread.
pub(crate) fn spawn(w: Writing) -> io::Result<Threads> {
    let (tx, rx) = crossbeam_channel::bounded::<Synced>(64);
    // Applied groups' buffers, cleared, back to the writer: the next group
    // the workers fill starts with their capacity, not from nothing.
    let (spare_tx, spare_rx) = crossbeam_channel::bounded::<Synced>(4);
    let apply = {
        let node = w.node.clone();
        let wal = w.wal.clone();
        let wakeups = w.wakeups.clone();
        std::thread::Builder::new()
            .name("pollbox-wal-apply".into())
            .spawn(move || apply_loop(&node, &wal, &wakeups, &rx, &spare_tx))?
    };
    let write = std::thread::Builder::new()
        .name("pollbox-wal".into())
        .spawn(move || write_loop(&w, &tx, &spare_rx))?;
    Ok(Threads { write, apply })
}

/// Faults the tests inject, in debug builds only (read once; a release
/// build has none):
/// - `POLLBOX_TEST_WAL_ACK_EARLY=1`: a broken build that applies and
///   answers a group before it is written (and waits 20 ms before writing
///   it), so the kill -9 test shows its checker catches lost answers;
/// - `POLLBOX_TEST_WAL_FAIL_SYNC_AFTER=N`: the sync after the N-th fails
///   (EIO), as a dying disk's would.
#[derive(Default)]
struct TestFaults {
    ack_early: bool,
    fail_sync_after: Option<u64>,
}

fn test_faults() -> &'static TestFaults {
    static FAULTS: std::sync::OnceLock<TestFaults> = std::sync::OnceLock::new();
    FAULTS.get_or_init(|| {
        if !cfg!(debug_assertions) {
            return TestFaults::default();
        }
        TestFaults {
            ack_early: std::env::var_os("POLLBOX_TEST_WAL_ACK_EARLY").is_some(),
            fail_sync_after: std::env::var("POLLBOX_TEST_WAL_FAIL_SYNC_AFTER")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    })
}

/// `fdatasync`, or the failure a test asked for.
fn sync(file: &File, syncs_before: u64) -> io::Result<()> {
    if test_faults()
        .fail_sync_after
        .is_some_and(|n| syncs_before >= n)
    {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    file.sync_data()
}

/// The segment being written.
struct Segment {
    file: File,
    first: u64,
    len: u64,
}

/// Why a group was not kept.
enum Fault {
    DiskFull(io::Error),
    /// A write failed another way; its bytes were taken back.
    Write(io::Error),
    /// The file cannot go on: a failed sync, or bytes that could not be taken back.
    Fatal(&'static str, String),
}

fn write_loop(
    w: &Writing,
    tx: &crossbeam_channel::Sender<Synced>,
    spares: &crossbeam_channel::Receiver<Synced>,
) {
    let wal = &w.wal;
    let mut segment: Option<Segment> = None;
    let mut buf = Vec::new();
    let mut tags = Vec::new();
    let mut values = Vec::new();
    loop {
        if buf.capacity() == 0 {
            if let Ok(spare) = spares.try_recv() {
                (buf, tags, values) = (spare.bytes, spare.tags, spare.values);
            }
        }
        let first = {
            let Ok(mut q) = wal.queue.lock() else { return };
            while q.tags.is_empty() && !q.stopping {
                q = match wal.queued.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
            if q.tags.is_empty() {
                return;
            }
            std::mem::swap(&mut buf, &mut q.bytes);
            std::mem::swap(&mut tags, &mut q.tags);
            std::mem::swap(&mut values, &mut q.values);
            q.first_seq
        };
        if test_faults().ack_early {
            // The broken build: answered before the bytes are anywhere.
            let early = Synced {
                bytes: buf.clone(),
                tags: std::mem::take(&mut tags),
                values: std::mem::take(&mut values),
            };
            if tx.send(early).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let kept = match wal.failed() {
            Some(_) => Err(None),
            None => write_group(wal, &mut segment, first, &buf).map_err(Some),
        };
        match kept {
            Ok(()) => {
                wal.disk_full.store(false, Ordering::Relaxed);
                wal.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                wal.records.fetch_add(tags.len() as u64, Ordering::Relaxed);
                let synced = Synced {
                    bytes: std::mem::take(&mut buf),
                    tags: std::mem::take(&mut tags),
                    values: std::mem::take(&mut values),
                };
                if tx.send(synced).is_err() {
                    return;
                }
            }
            Err(fault) => {
                if let Some(f) = fault {
                    count_fault(wal, f);
                }
                fail_all(&w.wakeups, &tags);
                buf.clear();
                tags.clear();
                values.clear();
            }
        }
    }
}

fn count_fault(wal: &Wal, fault: Fault) {
    let (kind, why) = match fault {
        Fault::DiskFull(e) => {
            if !wal.disk_full.swap(true, Ordering::Relaxed) {
                eprintln!("pollbox: wal: disk full ({e}): ingest answered 503 until space returns");
            }
            ("disk_full", None)
        }
        Fault::Write(e) => {
            eprintln!("pollbox: wal: write failed ({e}); those records were not kept");
            ("write", None)
        }
        Fault::Fatal(kind, why) => (kind, Some(why)),
    };
    if let Some(i) = FAULTS.iter().position(|k| *k == kind) {
        wal.errors[i].fetch_add(1, Ordering::Relaxed);
    }
    if let Some(why) = why {
        wal.fail(why);
    }
}

/// Every record of a group that was not kept is reported failed.
fn fail_all(wakeups: &Wakeups, tags: &[DeliveryTag]) {
    let mut reports = PassReports::new(wakeups.workers());
    for t in tags {
        reports.add(*t, Report::Failed);
    }
    reports.hand_over(wakeups);
}

fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Write a group (records from sequence number `first`) and sync it.
fn write_group(
    wal: &Wal,
    segment: &mut Option<Segment>,
    first: u64,
    bytes: &[u8],
) -> Result<(), Fault> {
    let roll = match segment {
        None => true,
        Some(s) => {
            s.len > SEGMENT_MAGIC.len() as u64 && s.len + bytes.len() as u64 > wal.segment_bytes
        }
    };
    if roll {
        let s = open_segment(wal, first).map_err(|e| match is_disk_full(&e) {
            true => Fault::DiskFull(e),
            false => Fault::Write(e),
        })?;
        *segment = Some(s);
    }
    let Some(s) = segment.as_mut() else {
        return Err(Fault::Write(io::Error::other("no segment")));
    };
    if let Err(e) = s.file.write_all_at(bytes, s.len) {
        // Take the group back, so the next one follows whole records.
        if let Err(cut) = s.file.set_len(s.len) {
            return Err(Fault::Fatal(
                "write",
                format!(
                    "a write to {} failed ({e}) and its bytes could not be taken back ({cut})",
                    wal.dir.join(segment_name(s.first)).display()
                ),
            ));
        }
        return Err(match is_disk_full(&e) {
            true => Fault::DiskFull(e),
            false => Fault::Write(e),
        });
    }
    let began = Instant::now();
    if let Err(e) = sync(&s.file, wal.syncs.load(Ordering::Relaxed)) {
        return Err(Fault::Fatal(
            "sync",
            format!(
                "fdatasync of {} failed: {e} (what it held may not be on disk; \
                 restart once the disk is sound: recovery keeps what was synced)",
                wal.dir.join(segment_name(s.first)).display()
            ),
        ));
    }
    wal.sync_seconds
        .observe_ns(began.elapsed().as_nanos() as u64);
    wal.syncs.fetch_add(1, Ordering::Relaxed);
    s.len += bytes.len() as u64;
    if let Ok(mut segs) = wal.segments.lock() {
        if let Some(last) = segs.last_mut().filter(|l| l.0 == s.first) {
            last.1 = s.len;
        }
    }
    Ok(())
}

/// Begin the segment whose first record is `first`: its magic synced, and
/// its name in the directory synced.
fn open_segment(wal: &Wal, first: u64) -> io::Result<Segment> {
    let path = wal.dir.join(segment_name(first));
    let made = (|| {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        file.write_all(SEGMENT_MAGIC)?;
        file.sync_data()?;
        sync_dir(&wal.dir)?;
        Ok(file)
    })();
    match made {
        Ok(file) => {
            if let Ok(mut segs) = wal.segments.lock() {
                segs.push((first, SEGMENT_MAGIC.len() as u64));
            }
            Ok(Segment {
                file,
                first,
                len: SEGMENT_MAGIC.len() as u64,
            })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Sync a directory, so the names created or removed in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Apply synced groups in order and report each record.
fn apply_loop(
    node: &Node,
    wal: &Wal,
    wakeups: &Wakeups,
    rx: &crossbeam_channel::Receiver<Synced>,
    spares: &crossbeam_channel::Sender<Synced>,
) {
    let mut replica = Replica::new(node.plan.clone(), node.config.limits.arena_limit_bytes, 1);
    let mut reports = PassReports::new(wakeups.workers());
    let mut key = Vec::new();
    let mut watchers: &Wakeups = wakeups;
    for mut group in rx {
        let (mut at, mut v_at) = (0, 0);
        // Values borrow the group's bytes: one list a group.
        let mut values = Vec::new();
        for t in &group.tags {
            let Ok(Some((rec, n))) = decode(&group.bytes[at..]) else {
                // Bytes this process encoded: never expected.
                reports.add(*t, Report::Failed);
                continue;
            };
            at += n;
            // The message as the worker projected it, when it came with it.
            let projected = group
                .values
                .get(v_at..v_at + 2)
                .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])))
                .and_then(|fields| {
                    let used = decode_values(&group.values[v_at + 2..], fields, &mut values)?;
                    v_at += 2 + used;
                    Some(fields)
                });
            let seq = rec.seq;
            let rec = record_of(&rec);
            let outcome = match projected {
                Some(fields) if fields > 0 => {
                    replica.apply_projected(&node.boxes, &rec, &values, &mut key, &mut watchers)
                }
                _ => replica.apply(&node.boxes, &rec, &mut key, &mut watchers),
            };
            reports.add(*t, outcome.report());
            wal.applied_next.store(seq + 1, Ordering::Release);
            if reports.records() >= 256 {
                reports.hand_over(wakeups);
            }
        }
        reports.hand_over(wakeups);
        group.bytes.clear();
        group.tags.clear();
        group.values.clear();
        // Full (the writer has spares enough): dropped.
        let _ = spares.try_send(group);
    }
}

/// A record of the file as the log's rules take it: partition 0, the
/// offset whose version is its sequence number.
pub(crate) fn record_of<'a>(rec: &pollbox_core::wal::WalRecord<'a>) -> Record<'a> {
    Record {
        partition: 0,
        offset: rec.seq as i64 - 1,
        timestamp_ms: rec.timestamp_ms,
        key: Some(rec.key),
        value: rec.value,
        headers: Default::default(),
    }
}
