//! `pollbox migrate --from STANDALONE.toml --to LOG.toml`: a standalone
//! node's boxes and write-ahead file into a Kafka topic, so the node becomes
//! a log cluster without losing a box or a version
//! (docs/operations.md#from-one-node-to-a-log).
//!
//! The standalone node is stopped first. Its snapshot holds the boxes up to
//! a position of the file; the file holds every record acknowledged since.
//! Into an empty topic, each partition gets, in order:
//!
//! 1. a **begin** record (no key, no value, the header `pollbox-begin`): the
//!    boxes before it are in the snapshot this command writes, not in the
//!    log, so a node that reads it (one started without that snapshot)
//!    stops applying and says so;
//! 2. the file's records past the snapshot whose key lives there (murmur2,
//!    as every producer of a pollbox topic), each with its timestamp and the
//!    version it was served at (the header `pollbox-version`): a node
//!    applies it at exactly that version (`pollbox_core::log::Bases`);
//! 3. a **marker** (no key, no value, `pollbox-version`: past every version
//!    the standalone node served or removed), so whatever is produced next
//!    goes on past it.
//!
//! Then it writes the log's snapshot at the `--to` config's `snapshot.path`:
//! the standalone snapshot's boxes, versions and version floor, positioned
//! just after each begin record. Every node of the cluster starts from a
//! copy of it (snapshots are portable) and replays the rest from the log:
//! the same boxes at the same versions as the standalone node served.
//!
//! What it is not: a copy tool for a live node (stop it first), or a way
//! into a topic that holds records (it refuses one: versions would mix).

use crate::clock::{wall_ms, wall_us};
use crate::log::client_config;
use crate::log::topic;
use crate::snapshot_file::{self, Snapshots};
use crate::wal::recover::read_records;
use crate::wal::WAL_TOPIC;
use pollbox_core::boxes::BoxTable;
use pollbox_core::config::Config;
use pollbox_core::log::{home_partition, Position, BEGIN_HEADER, VERSION_HEADER};
use pollbox_core::plan::Plan;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long a request to the brokers may take.
const REQUEST: Duration = Duration::from_secs(10);
/// How long the last records may take to be acknowledged.
const FLUSH: Duration = Duration::from_secs(120);

/// What a migration did.
#[derive(Debug)]
pub struct Migrated {
    /// Boxes the snapshot written holds.
    pub boxes: usize,
    /// Records of the write-ahead file produced (past the snapshot).
    pub records: u64,
    pub partitions: usize,
    /// The version the topic's partitions go on past.
    pub next_version: u64,
    /// The log's snapshot written.
    pub snapshot: PathBuf,
    /// Where each partition's replay starts (just after its begin record).
    pub position: Position,
}

/// Which record a delivery report is about.
const RECORD: usize = 0;
const BEGIN: usize = 1;
const MARKER: usize = 2;

/// What the delivery reports said: each begin record's offset, and the
/// records that were not acknowledged.
#[derive(Default)]
struct Delivered {
    begins: Mutex<BTreeMap<i32, i64>>,
    failed: Mutex<Vec<String>>,
}

impl ClientContext for Delivered {}

impl ProducerContext for Delivered {
    type DeliveryOpaque = usize;

    fn delivery(&self, r: &DeliveryResult<'_>, what: usize) {
        match r {
            Ok(m) if what == BEGIN => {
                self.begins
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(m.partition(), m.offset());
            }
            Ok(_) => {}
            Err((e, m)) => self
                .failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("partition {}: {e}", m.partition())),
        }
    }
}

/// Move the standalone node of `from` (`[wal]` and `[snapshot]`) into the
/// log of `to` (`[log]` and `[snapshot]`). Every refusal says why and what
/// to do; nothing is produced before every check passed.
pub fn migrate(from: &Config, to: &Config) -> Result<Migrated, String> {
    from.validate().map_err(|e| format!("--from: {e}"))?;
    to.validate().map_err(|e| format!("--to: {e}"))?;
    if !from.wal.enabled() {
        return Err("--from names no [wal] path: a standalone node with a write-ahead file is migrated (a node without one loses up to snapshot.interval_s in a crash, so nothing says its snapshot is the last word)".into());
    }
    if !to.log.enabled() {
        return Err("--to names no [log] brokers: the cluster's config".into());
    }
    if to.snapshot.path.is_empty() {
        return Err("--to names no snapshot.path: the log's snapshot is written there, and the cluster's nodes start from copies of it".into());
    }
    if from.boxes != to.boxes {
        return Err("the [boxes] of --from and --to differ: the records would be applied under other rules; give both the same [boxes]".into());
    }
    let out = PathBuf::from(&to.snapshot.path);
    if out.exists() || snapshot_file::delta_path(&out, 1).exists() {
        return Err(format!(
            "{} exists: move it away (the migration writes the cluster's first snapshot there)",
            out.display()
        ));
    }
    let plan = Arc::new(Plan::compile(&from.boxes).map_err(|e| e.to_string())?);
    let now_ms = wall_ms();
    let (boxes, from_seq) = load_standalone(from, &plan, now_ms)?;
    let dir = PathBuf::from(&from.wal.path);
    // The file read once before anything is produced: damage refuses here.
    let read =
        read_records(&dir, from_seq, false, |_, _| {}).map_err(|e| format!("--from: {e}"))?;
    // Past every version served: the file's records, the snapshot's boxes
    // and those it removed (as a start of the standalone node counts).
    let mut highest = boxes.version_floor().max(read.last_seq);
    boxes.for_each(now_ms, |_, v, _, _| highest = highest.max(v));
    let next_version = (highest + 1).max(from_seq).max(wall_us());

    let info = topic::check(&to.log).map_err(|e| format!("--to: {e}"))?;
    let partitions = info.partitions;
    check_empty(to, partitions)?;
    let mut c = client_config(&to.log);
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    let producer: ThreadedProducer<Delivered> = c
        .create_with_context(Delivered::default())
        .map_err(|e| format!("cannot create the Kafka producer: {e}"))?;
    let topic = to.log.topic.as_str();
    let produce = |rec: BaseRecord<'_, [u8], [u8], usize>| send(&producer, rec);
    for p in 0..partitions as i32 {
        let begin = OwnedHeaders::new().insert(Header {
            key: BEGIN_HEADER,
            value: Some(from.snapshot.path.as_bytes()),
        });
        produce(
            BaseRecord::with_opaque_to(topic, BEGIN)
                .partition(p)
                .headers(begin),
        )?;
    }
    let mut failed = None;
    let sent = read_records(&dir, from_seq, false, |_, r| {
        if failed.is_some() {
            return;
        }
        let seq = r.seq.to_be_bytes();
        let named = OwnedHeaders::new().insert(Header {
            key: VERSION_HEADER,
            value: Some(&seq[..]),
        });
        let mut rec = BaseRecord::with_opaque_to(topic, RECORD)
            .partition(home_partition(r.key, partitions as u32))
            .key(r.key)
            .timestamp(r.timestamp_ms)
            .headers(named);
        if let Some(v) = r.value {
            rec = rec.payload(v);
        }
        if let Err(e) = produce(rec) {
            failed = Some(e);
        }
    })
    .map_err(|e| format!("--from: {e}"))?;
    if let Some(e) = failed {
        return Err(e);
    }
    let next = next_version.to_be_bytes();
    for p in 0..partitions as i32 {
        let marker = OwnedHeaders::new().insert(Header {
            key: VERSION_HEADER,
            value: Some(&next[..]),
        });
        produce(
            BaseRecord::with_opaque_to(topic, MARKER)
                .partition(p)
                .headers(marker),
        )?;
    }
    producer
        .flush(FLUSH)
        .map_err(|e| format!("the records were not all acknowledged in {FLUSH:?}: {e}"))?;
    let delivered = producer.context();
    let failed = delivered
        .failed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let begins = delivered
        .begins
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if !failed.is_empty() || begins.len() != partitions {
        return Err(format!(
            "the log did not take every record ({}); the topic {topic} now holds part of them: \
             delete it, create it again empty and run the migration again",
            failed.join("; ")
        ));
    }
    let position = Position {
        topic: topic.to_string(),
        next: begins.iter().map(|(&p, &o)| (p, o + 1)).collect(),
        base: BTreeMap::new(),
    };
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    Snapshots::new(out.clone(), None)
        .compact_at(0)
        .save(&boxes, now_ms, Some(&position))
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok(Migrated {
        boxes: boxes.len(),
        records: sent.replayed,
        partitions,
        next_version,
        snapshot: out,
        position,
    })
}

/// The standalone node's snapshot (the file's position it holds: the first
/// record past it). None is fine: the file then holds every box.
fn load_standalone(
    from: &Config,
    plan: &Arc<Plan>,
    now_ms: u64,
) -> Result<(BoxTable, u64), String> {
    let path = Path::new(&from.snapshot.path);
    let fresh = || BoxTable::new(plan.clone());
    match snapshot_file::load(fresh, now_ms, path) {
        Ok(None) => Ok((fresh(), 0)),
        Ok(Some(loaded)) => match loaded.position {
            Some(p) if p.topic == WAL_TOPIC => {
                let next = p.next.get(&0).map_or(0, |&n| n.max(0) as u64);
                Ok((loaded.table, next))
            }
            Some(p) => Err(format!(
                "--from: the snapshot {} was written by a node of the log topic {:?}: it is a log node's already",
                path.display(),
                p.topic
            )),
            None => Err(format!(
                "--from: the snapshot {} holds no write-ahead position (written before [wal] was on): start the node once with its [wal] and stop it, then migrate",
                path.display()
            )),
        },
        Err(e) => Err(format!("--from: the snapshot {}: {e}", path.display())),
    }
}

/// Refuse a topic that holds records: its versions and the file's would mix.
fn check_empty(to: &Config, partitions: usize) -> Result<(), String> {
    let c: BaseConsumer = client_config(&to.log)
        .set("group.id", "pollbox-migrate")
        .create()
        .map_err(|e| format!("cannot create the Kafka client: {e}"))?;
    let mut held = Vec::new();
    for p in 0..partitions as i32 {
        let (low, high) = c
            .fetch_watermarks(&to.log.topic, p, REQUEST)
            .map_err(|e| format!("reading partition {p}'s offsets: {e}"))?;
        if high > low {
            held.push(format!("partition {p} holds offsets {low}..{high}"));
        }
    }
    if held.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the topic {} holds records ({}): migrate into a new, empty topic (the file's versions must come first)",
        to.log.topic,
        held.join(", ")
    ))
}

/// Hand `rec` to the producer, waiting while its queue is full.
fn send(
    producer: &ThreadedProducer<Delivered>,
    mut rec: BaseRecord<'_, [u8], [u8], usize>,
) -> Result<(), String> {
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(format!("cannot produce: {e}")),
        }
    }
}
