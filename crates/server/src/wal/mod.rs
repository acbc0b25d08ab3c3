//! The write-ahead file (docs/operations.md#the-write-ahead-file): with
//! `[wal] path` set, a standalone node is a log of one partition kept on its
//! own disk. Ingest takes the path of a node of a Kafka log
//! (`pollbox_core::service::Pending`): the workers append each accepted
//! message ([`Wal::append`]), one thread writes what was appended meanwhile
//! and syncs it (`fdatasync`: one sync for every worker's records, group
//! commit), another applies the synced records in file order, each at the
//! version its position gives, and reports each to its waiting connection
//! as the log's consuming thread does. So a poll never sees a version that
//! is not on disk, and a replay gives every box the version it was served
//! at.
//!
//! - [`writer`]: the writing thread (`pollbox-wal`: segments, sync, faults)
//!   and the applying thread (`pollbox-wal-apply`).
//! - [`recover`]: the start: the records past the snapshot replayed, a torn
//!   tail cut off, damage before the end refused.
//!
//! What it is not: the record format (`pollbox_core::wal`, pure bytes), or
//! the rules of a record (`pollbox_core::log::Replica`, the log's).

pub(crate) mod recover;
pub(crate) mod writer;

use crate::log::DeliveryTag;
use crate::stats::Histogram;
use pollbox_core::log::Position;
use pollbox_core::service::LogRecord;
use pollbox_core::wal::{encode, encode_values, WalRecord};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

/// The topic a snapshot's position names when it is a write-ahead file's
/// (partition 0, the next record's sequence number): not a Kafka topic name
/// (those have no spaces or parentheses), so a node of a log refuses it and
/// this node refuses a log's.
pub(crate) const WAL_TOPIC: &str = "(write-ahead file)";

/// Faults by kind (`pollbox_wal_errors_total{kind}`).
pub(crate) const FAULTS: [&str; 3] = ["disk_full", "sync", "write"];

/// Upper bounds (seconds) of the sync latency histogram.
pub(crate) const SYNC_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.010, 0.025, 0.050, 0.100, 0.250,
    1.0, 5.0,
];

/// Records appended and not yet handed to the writing thread.
#[derive(Default)]
pub(crate) struct Queue {
    /// Their bytes, encoded, in sequence order.
    pub bytes: Vec<u8>,
    pub tags: Vec<DeliveryTag>,
    /// Each record's message as the worker projected it (a field count u16,
    /// then `pollbox_core::wal::encode_values`), in the same order: the
    /// apply does not parse it again. Never written to the file.
    pub values: Vec<u8>,
    /// The sequence number of the first of them.
    pub first_seq: u64,
    /// The sequence number the next record gets.
    pub next_seq: u64,
    /// No more appends: the workers have stopped.
    pub stopping: bool,
}

/// The write-ahead file as every thread sees it: what the workers append
/// to, where it stands, its faults and counters.
pub(crate) struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    queue: Mutex<Queue>,
    queued: Condvar,
    /// Why the file stopped taking records for good (a failed sync, or a
    /// write whose bytes could not be taken back): unready, ingest refused.
    failed: OnceLock<String>,
    /// The last write found the disk full (cleared by the next one that
    /// fits).
    disk_full: AtomicBool,
    /// Every record before this sequence number is applied (the position a
    /// snapshot stores).
    applied_next: AtomicU64,
    /// Segments on disk: (first sequence number, bytes), in order.
    segments: Mutex<Vec<(u64, u64)>>,
    pub syncs: AtomicU64,
    pub sync_seconds: Histogram<14>,
    pub bytes: AtomicU64,
    pub records: AtomicU64,
    /// By [`FAULTS`].
    pub errors: [AtomicU64; 3],
}

impl Wal {
    /// The file in `dir` as recovery left it: its segments, the next
    /// sequence number, every record before `applied_next` applied.
    pub(crate) fn new(
        dir: PathBuf,
        segment_bytes: u64,
        segments: Vec<(u64, u64)>,
        next_seq: u64,
        applied_next: u64,
    ) -> Wal {
        Wal {
            dir,
            segment_bytes,
            queue: Mutex::new(Queue {
                first_seq: next_seq,
                next_seq,
                ..Queue::default()
            }),
            queued: Condvar::new(),
            failed: OnceLock::new(),
            disk_full: AtomicBool::new(false),
            applied_next: AtomicU64::new(applied_next),
            segments: Mutex::new(segments),
            syncs: AtomicU64::new(0),
            sync_seconds: Histogram::new(&SYNC_BUCKETS),
            bytes: AtomicU64::new(0),
            records: AtomicU64::new(0),
            errors: Default::default(),
        }
    }

    /// Append a request's `records` for worker `worker`'s request
    /// `request`: each gets the next sequence number, and is reported to
    /// the worker once it is synced and applied (or failed). Returns how many
    /// were taken: all, or none when the file failed for good.
    pub(crate) fn append(&self, worker: u16, request: u64, records: &[LogRecord<'_>]) -> usize {
        if self.failed().is_some() {
            return 0;
        }
        let timestamp_ms = crate::clock::wall_ms() as i64;
        let Ok(mut q) = self.queue.lock() else {
            return 0;
        };
        if q.stopping {
            return 0;
        }
        if q.tags.is_empty() {
            q.first_seq = q.next_seq;
        }
        for r in records {
            let seq = q.next_seq;
            q.next_seq += 1;
            encode(
                &WalRecord {
                    seq,
                    timestamp_ms,
                    key: r.key,
                    value: r.value,
                },
                &mut q.bytes,
            );
            q.values
                .extend_from_slice(&(r.values.len() as u16).to_le_bytes());
            encode_values(r.values, &mut q.values);
            q.tags.push(DeliveryTag {
                worker,
                request,
                index: r.index,
            });
        }
        drop(q);
        self.queued.notify_one();
        records.len()
    }

    /// Why the file stopped taking records for good, if it did.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    pub(crate) fn fail(&self, why: String) {
        if self.failed.set(why.clone()).is_ok() {
            eprintln!("pollbox: wal: {why}; not acknowledging ingest, not ready");
        }
    }

    /// Whether the last write found the disk full.
    pub(crate) fn disk_full(&self) -> bool {
        self.disk_full.load(Ordering::Relaxed)
    }

    /// What a refused or failed ingest is answered (503).
    pub(crate) fn unavailable(&self) -> &'static str {
        if self.disk_full() {
            "disk full"
        } else if self.failed().is_some() {
            "write-ahead file failed"
        } else {
            "write-ahead file unavailable"
        }
    }

    /// The position a snapshot stores: every record before it applied.
    /// Taken before the snapshot walks the boxes.
    pub(crate) fn position(&self) -> Position {
        let next = self.applied_next.load(Ordering::Acquire);
        Position {
            topic: WAL_TOPIC.into(),
            next: [(0, i64::try_from(next).unwrap_or(i64::MAX))]
                .into_iter()
                .collect(),
            base: Default::default(),
        }
    }

    /// Segments on disk and their bytes.
    pub(crate) fn on_disk(&self) -> (usize, u64) {
        self.segments
            .lock()
            .map(|s| (s.len(), s.iter().map(|(_, b)| b).sum()))
            .unwrap_or_default()
    }

    /// A snapshot holding every record before `position` is durable: delete
    /// the segments it covers (each whose next segment starts at or before
    /// it; the newest is never deleted). Returns how many were deleted.
    pub(crate) fn snapshot_covers(&self, position: &Position) -> usize {
        if position.topic != WAL_TOPIC {
            return 0;
        }
        let Some(&next) = position.next.get(&0) else {
            return 0;
        };
        let next = u64::try_from(next).unwrap_or(0);
        let Ok(mut segs) = self.segments.lock() else {
            return 0;
        };
        let covered = segs.windows(2).take_while(|w| w[1].0 <= next).count();
        let mut deleted = 0;
        for &(first, _) in &segs[..covered] {
            let p = self.dir.join(pollbox_core::wal::segment_name(first));
            match std::fs::remove_file(&p) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => deleted += 1,
                Err(e) => {
                    eprintln!("pollbox: wal: cannot delete {}: {e}", p.display());
                    break;
                }
            }
        }
        segs.drain(..deleted);
        deleted
    }

    /// No more appends (the workers have stopped): the writing thread
    /// writes what is queued and ends.
    pub(crate) fn stop(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.stopping = true;
        }
        self.queued.notify_all();
    }
}
