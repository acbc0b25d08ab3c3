//! The consuming threads: every partition of the topic, from where the
//! snapshot left it, applied in partition order and waking whoever waits on
//! the keys. The first thread reads where each partition starts, then
//! starts the others (`log.consumers`); thread `k` of `n` owns the
//! partitions `p` with `p % n == k` (assigned, not subscribed), with its own
//! client and [`Replica`], so a key's records (one partition) are applied
//! in order by one thread. After each record a thread hands this node's
//! acknowledged records at that offset to their workers
//! (`PartitionAcks::applied`). [`Consuming`] is what they are handed.
//!
//! What it is not: the producer's delivery reports (`deliveries.rs`) or the
//! log's end (`ends.rs`), each a thread of its own.

use super::context::{Client, LogState, PartitionState, PassReports, RecordCounts, RecordResult};
use super::topic::{self, LogProblem};
use super::topic_id;
use super::{client_config, LOG_REFUSED_EXIT};
use crate::lifecycle::Lifecycle;
use crate::wakeups::Wakeups;
use pollbox_core::config::LogConfig;
use pollbox_core::log::{Headers, Outcome, Position, Record, Replica};
use pollbox_core::service::Node;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Headers as _};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one wait for records lasts: the thread checks for shutdown at
/// least this often.
const POLL: Duration = Duration::from_millis(100);
/// Records applied in one pass at most: a pass ends when the client's queue
/// is empty, or after this many records (a replay's queue is never empty),
/// and then the workers learn what it applied.
const PASS_RECORDS: u32 = 256;
/// Between two attempts to reach an unreachable log.
const RETRY: Duration = Duration::from_secs(1);
/// One metadata or watermark request.
const REQUEST: Duration = Duration::from_secs(5);
/// `fetch.wait.max.ms` of the consuming clients unless `[log.client]` sets it.
pub(crate) const FETCH_WAIT_MS: &str = "2000";
/// The group id the client needs to be assigned partitions; nothing is
/// committed under it (each node's position is in its snapshot).
const GROUP: &str = "pollbox-replica";

/// A consumer that is assigned partitions (no group membership, no commits)
/// and reads only committed records (a transactional producer's aborted
/// records never reach the boxes).
fn consumer(cfg: &LogConfig) -> KafkaResult<BaseConsumer> {
    let mut c = client_config(cfg);
    c.set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed");
    if !cfg.client.contains_key("fetch.queue.backoff.ms") {
        // When the client's queue of fetched records is full it stops
        // fetching for this long (1 s by default): a replay that applies
        // slower than the client fetches then idles most of the time
        // (134 k records/s instead of 743 k: BENCHMARKS.md, "The Kafka log").
        c.set("fetch.queue.backoff.ms", "10");
    }
    if !cfg.client.contains_key("fetch.wait.max.ms") {
        // How long the broker holds a fetch that finds no record (500 ms by
        // default). A record answers it at once (`fetch.min.bytes` 1), so
        // this costs no latency; it is what an idle node pays: each
        // consuming thread's client asks again this often. 2 s keeps an idle
        // node of two consuming threads under 0.3 % of a core (BENCHMARKS.md,
        // "The Kafka log"; judged under the fault suite and a rolling
        // restart beside 500 ms).
        c.set("fetch.wait.max.ms", FETCH_WAIT_MS);
    }
    c.create()
}

/// What the consuming threads read, apply to, wake and report to, handed
/// over by the server (each part is owned by its module and shared).
pub(crate) struct Consuming {
    /// The config, the plan and the box table records are applied to.
    pub(crate) node: Arc<Node>,
    /// Where the node stands in the log: these threads move it.
    pub(crate) log: Arc<LogState>,
    /// Who waits on a key, and the workers records produced here are
    /// reported to.
    pub(crate) wakeups: Arc<Wakeups>,
    /// Draining (the log's start is no longer waited for) and the workers
    /// stopped (the threads end).
    pub(crate) lifecycle: Arc<Lifecycle>,
}

impl Consuming {
    /// Shutting down: the log's start is no longer waited for.
    fn stopping(&self) -> bool {
        self.lifecycle.is_draining()
    }

    /// The workers have drained: nobody awaits a record any more.
    fn done(&self) -> bool {
        self.lifecycle.workers_stopped()
    }
}

/// A log line said once, until something else is said, and at most one line
/// in [`QUIET`] (a log down for an hour is a few lines, not thousands).
#[derive(Default)]
struct Throttled {
    last: String,
    at: Option<Instant>,
}

/// The least time between two lines of [`Throttled`].
const QUIET: Duration = Duration::from_secs(30);

impl Throttled {
    fn say(&mut self, what: String) {
        if what == self.last || self.at.is_some_and(|t| t.elapsed() < QUIET) {
            return;
        }
        eprintln!("pollbox: log: {what}");
        self.last = what;
        self.at = Some(Instant::now());
    }
}

/// The first consuming thread (`pollbox-log`): where each partition starts,
/// then the other threads, then its own share of the partitions.
pub(crate) fn run(c: &Arc<Consuming>) {
    // Polls first: this thread, and the client's threads it starts (they
    // fetch and decompress), run at nice 19 on the cores the workers use, so
    // a poll that becomes readable is not kept waiting by a replay. Idle
    // workers leave it all the CPU; saturated ones, little (its lag shows it).
    crate::thread_priority::lower_priority("log");
    let cfg = &c.node.config.log;
    let mut said = Throttled::default();
    let client = match consumer(cfg) {
        Ok(c) => c,
        Err(e) => refuse(&format!("cannot create the Kafka client: {e}")),
    };
    let Some(start) = starting(c, &client, &mut said) else {
        return; // shut down before the log answered
    };
    let start = Arc::new(start);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cfg.consuming_threads(start.offsets.len(), cores);
    if threads > 1 {
        eprintln!(
            "pollbox: log: {threads} consuming threads, partition p applied by thread p % {threads}"
        );
    }
    let mut others = Vec::with_capacity(threads - 1);
    for k in 1..threads {
        let (c, start) = (c.clone(), start.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("pollbox-log-{k}"))
            .spawn(move || {
                crate::thread_priority::lower_priority("log");
                let client = match consumer(&c.node.config.log) {
                    Ok(client) => client,
                    Err(e) => refuse(&format!("cannot create the Kafka client: {e}")),
                };
                apply(&c, &client, &start, Share { k, of: threads });
            });
        match spawned {
            Ok(h) => others.push(h),
            Err(e) => refuse(&format!("cannot start consuming thread {k}: {e}")),
        }
    }
    apply(c, &client, &start, Share { k: 0, of: threads });
    for h in others {
        let _ = h.join();
    }
}

/// Which partitions a consuming thread owns: `p % of == k`.
#[derive(Debug, Clone, Copy)]
struct Share {
    k: usize,
    of: usize,
}

impl Share {
    fn owns(self, partition: usize) -> bool {
        partition % self.of == self.k
    }
}

/// Where the consuming threads start.
#[derive(Debug)]
struct Start {
    /// Each partition's first offset to apply, by partition id.
    offsets: Vec<i64>,
    /// The run of the table's watermarks: the topic's
    /// ([`topic_id::run`]).
    run: u64,
}

/// Apply the partitions of `share` from `start` until the workers stop (or
/// the log halts).
fn apply(c: &Consuming, consumer: &BaseConsumer, start: &Start, share: Share) {
    let log = &*c.log;
    let parts = start.offsets.len();
    let owned = || {
        start
            .offsets
            .iter()
            .enumerate()
            .filter(move |(p, _)| share.owns(*p))
    };
    let mut said = Throttled::default();
    let mut misplaced = Misplaced::default();
    let mut tpl = TopicPartitionList::new();
    for (p, &next) in owned() {
        if let Err(e) = tpl.add_partition_offset(log.topic(), p as i32, Offset::Offset(next)) {
            refuse(&format!("cannot assign partition {p}: {e}"));
        }
    }
    if let Err(e) = consumer.assign(&tpl) {
        refuse(&format!("cannot assign the topic's partitions: {e}"));
    }
    let mut replica = Replica::new(
        c.node.plan.clone(),
        c.node.config.limits.arena_limit_bytes,
        parts as u32,
    )
    .with_bases(log.loaded().map_or(&BTreeMap::new(), |l| &l.base));
    // The table's lanes are the topic's partitions: a watermark means the
    // same on every node of the log (docs/boxes.md#watermarks).
    let lanes = c.node.boxes.lanes();
    lanes.for_partitions(parts, start.run);
    for (p, &next) in owned() {
        let at = u64::try_from(next).unwrap_or(0);
        lanes.restored(p, at.saturating_add(base_of(log.loaded(), p)));
    }
    let mut key = Vec::with_capacity(256);
    if log.catch_up() {
        eprintln!("pollbox: log: caught up (nothing to replay)");
    }
    let mut pass = PassReports::new(c.wakeups.workers());
    let mut counts = RecordCounts::default();
    // A pass goes on without waiting while records are queued; it ends, and
    // the workers learn what it applied, when the queue is empty.
    let mut wait = POLL;
    while !c.done() && !log.halted() {
        let polled = consumer.poll(wait);
        match polled {
            None => {
                pass.hand_over(&c.wakeups);
                counts.flush(log);
                wait = POLL;
            }
            Some(Err(e)) => {
                pass.hand_over(&c.wakeups);
                counts.flush(log);
                wait = POLL;
                let fatal = matches!(e, KafkaError::MessageConsumptionFatal(_));
                log.client_error(
                    Client::Consumer,
                    e.rdkafka_error_code(),
                    fatal,
                    &e.to_string(),
                );
                log.exchanged(false);
            }
            Some(Ok(m)) => {
                log.exchanged(true);
                let rec = Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis().unwrap_or_else(wall_ms),
                    key: m.key(),
                    value: m.payload(),
                    headers: headers_of(&m),
                };
                let caught_up = log.caught_up();
                // Its waiters are woken as an HTTP ingest's are.
                let outcome = replica.apply(&c.node.boxes, &rec, &mut key, &mut &*c.wakeups);
                let result = RecordResult::of(&outcome, caught_up);
                counts.add(result);
                match &outcome {
                    Outcome::Replayed if result == RecordResult::OutOfOrder => {
                        said.say(format!(
                            "the record at {}/{} offset {} is older than its box {:?}; skipped",
                            log.topic(),
                            rec.partition,
                            rec.offset,
                            String::from_utf8_lossy(&key)
                        ));
                    }
                    Outcome::WrongPartition { home } => {
                        misplaced.say(log.topic(), &rec, &key, *home, parts);
                    }
                    Outcome::Begin => {
                        log.halt(format!(
                            "partition {} of {} begins at offset {} with a standalone node's boxes (pollbox migrate), which are in the snapshot the migration wrote, not in the log: start this node from that snapshot (copy it to snapshot.path)",
                            rec.partition,
                            log.topic(),
                            rec.offset
                        ));
                        continue;
                    }
                    Outcome::Invalid(why) => eprintln!(
                        "pollbox: log: skipped the record at {}/{} offset {}: {}",
                        log.topic(),
                        rec.partition,
                        rec.offset,
                        why.describe(&c.node.plan)
                    ),
                    _ => {}
                }
                if let Some(p) = partition(log, rec.partition) {
                    // The partition moves past the record, and whoever of
                    // this node's connections awaits it, acknowledged, is
                    // told.
                    let mut advance = || {
                        p.acks()
                            .applied(rec.offset, outcome.report(), |tag, r, produced| {
                                log.observe_ack(produced.elapsed().as_nanos() as u64);
                                pass.add(tag, r);
                            })
                    };
                    if rec.headers.version.is_some() {
                        // A migration's record may have raised the base.
                        p.raised(replica.base(rec.partition), advance);
                    } else {
                        advance();
                    }
                }
                if !caught_up && log.catch_up() {
                    eprintln!("pollbox: log: caught up; ready");
                }
                if pass.records() >= PASS_RECORDS {
                    pass.hand_over(&c.wakeups);
                }
                // A replay's queue is never empty: its counts go up every
                // PASS_RECORDS records all the same.
                if counts.held() >= u64::from(PASS_RECORDS) {
                    counts.flush(log);
                }
                wait = Duration::ZERO;
            }
        }
    }
    pass.hand_over(&c.wakeups);
    counts.flush(log);
}

/// The pollbox headers of `m` ([`Headers`]): none on almost every record.
#[inline]
fn headers_of(m: &BorrowedMessage<'_>) -> Headers {
    let mut h = Headers::default();
    if let Some(all) = m.headers() {
        for one in all.iter() {
            h.read(one.key, one.value);
        }
    }
    h
}

/// Partition `p`'s version base in the snapshot `loaded` (0 without one).
fn base_of(loaded: Option<&Position>, p: usize) -> u64 {
    let p = i32::try_from(p).unwrap_or(i32::MAX);
    loaded.and_then(|l| l.base.get(&p)).copied().unwrap_or(0)
}

/// Partition `p` of the log, once known.
#[inline]
fn partition(log: &LogState, p: i32) -> Option<&PartitionState> {
    log.partitions()?.get(usize::try_from(p).ok()?)
}

/// Records outside their key's home partition: the first is said at once,
/// with the producer setting that fixes it; then a line with the count at
/// most every [`QUIET`].
#[derive(Default)]
struct Misplaced {
    count: u64,
    said_at: Option<Instant>,
}

impl Misplaced {
    fn say(&mut self, topic: &str, rec: &Record<'_>, key: &[u8], home: i32, partitions: usize) {
        self.count += 1;
        if self.said_at.is_some_and(|t| t.elapsed() < QUIET) {
            return;
        }
        self.said_at = Some(Instant::now());
        eprintln!(
            "pollbox: log: the record at {topic}/{} offset {} (key {:?}) is not in its key's home partition {home} (murmur2 of the key modulo {partitions} partitions), so no node applies it ({} such records so far). Its producer must partition as Kafka's Java client does: partitioner=murmur2_random for librdkafka clients (confluent-kafka for Python, Go and .NET, node-rdkafka, kcat), whose own default differs",
            rec.partition,
            rec.offset,
            String::from_utf8_lossy(key),
            self.count
        );
    }
}

/// Where the consuming threads start: each partition's offset (the
/// snapshot's, else the log's start) and the run of the topic. A snapshot
/// the log can no longer complete (retention removed the records after its
/// offsets) is refused, naming the partitions; so is a node without a
/// snapshot on a log whose start is gone. Retries (and stays unready) while
/// the log cannot be reached.
fn starting(c: &Consuming, consumer: &BaseConsumer, said: &mut Throttled) -> Option<Start> {
    let (log, cfg) = (&*c.log, &c.node.config.log);
    let mut id_said = false;
    loop {
        if c.stopping() {
            return None;
        }
        let info = match topic::check(cfg) {
            Ok(info) => info,
            Err(p) if p.is_fatal() => refuse(&p.to_string()),
            Err(p) => {
                log.start_failed();
                said.say(format!(
                    "{p}; serving the snapshot's boxes, not ready, retrying"
                ));
                std::thread::sleep(RETRY);
                continue;
            }
        };
        let found = info.settings.unsafe_settings();
        if !found.is_empty() {
            log.set_unsafe_topic();
            eprintln!(
                "pollbox: log: WARNING: {}; taken because log.allow_unsafe_topic = true (development only)",
                LogProblem::Unsafe {
                    topic: log.topic().to_string(),
                    found
                }
            );
        }
        if !id_said && info.id.is_none() {
            eprintln!(
                "pollbox: log: the brokers give topic {} no id (Kafka before 2.8): its watermarks are named after its name, so a topic deleted and created again under that name is taken for the same one by a client's Last-Event-ID",
                log.topic()
            );
            id_said = true;
        }
        let marks = match watermarks(consumer, log.topic()) {
            Ok(marks) => marks,
            Err(e) => {
                log.start_failed();
                said.say(format!(
                    "cannot read topic {} from {}: {e}; serving the snapshot's boxes, not ready, retrying",
                    log.topic(),
                    cfg.brokers
                ));
                std::thread::sleep(RETRY);
                continue;
            }
        };
        let offsets = first_offsets(log, &marks);
        let from = match log.loaded() {
            Some(l) => format!("the snapshot's offsets ({l})"),
            None => "the log's start (no snapshot)".to_string(),
        };
        let id = info
            .id
            .as_ref()
            .map_or(String::new(), |id| format!(" (id {id})"));
        eprintln!(
            "pollbox: log: {} partitions of {}{id}; replaying from {from} up to the end at start ({})",
            marks.len(),
            log.topic(),
            marks
                .iter()
                .enumerate()
                .map(|(p, (_, high))| format!("{p}@{high}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        log.set_partitions(
            marks
                .iter()
                .zip(&offsets)
                .enumerate()
                .map(|(p, (&(_, high), &next))| {
                    PartitionState::new(next, high, base_of(log.loaded(), p))
                })
                .collect(),
        );
        return Some(Start {
            offsets,
            run: topic_id::run(info.id.as_ref(), log.topic()),
        });
    }
}

/// Each partition's first offset to apply, given its `marks` (low, high):
/// the snapshot's, else 0. Refuses to start if the log no longer holds it.
fn first_offsets(log: &LogState, marks: &[(i64, i64)]) -> Vec<i64> {
    let loaded = log.loaded();
    let mut offsets = Vec::with_capacity(marks.len());
    let mut gone = Vec::new();
    for (p, &(low, _)) in marks.iter().enumerate() {
        let from = loaded
            .and_then(|l| l.next.get(&(p as i32)).copied())
            .unwrap_or(0);
        if from < low {
            gone.push(format!(
                "partition {p} (needs offset {from}, the log starts at {low})"
            ));
        }
        offsets.push(from);
    }
    if !gone.is_empty() {
        let whose = if loaded.is_some() {
            "the snapshot's offsets are no longer in the log"
        } else {
            "this node has no snapshot and the log no longer starts at offset 0"
        };
        refuse(&format!(
            "{whose} (retention removed them): {}; start this node from a recent snapshot of a peer (snapshots are portable between nodes)",
            gone.join(", ")
        ));
    }
    offsets
}

/// Low and high watermark of each partition of `topic`, by partition id.
fn watermarks(c: &BaseConsumer, topic: &str) -> Result<Vec<(i64, i64)>, String> {
    let md = c
        .fetch_metadata(Some(topic), REQUEST)
        .map_err(|e| e.to_string())?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("topic {topic} not in the metadata"))?;
    if let Some(e) = t.error() {
        return Err(format!("topic {topic}: {e:?}"));
    }
    let n = t.partitions().len();
    if n == 0 {
        return Err(format!("topic {topic} has no partitions"));
    }
    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    if ids.iter().enumerate().any(|(i, &id)| id != i as i32) {
        return Err(format!("topic {topic}: partition ids are not 0..{n}"));
    }
    ids.iter()
        .map(|&p| {
            c.fetch_watermarks(topic, p, REQUEST)
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The log cannot serve this node: say why and exit (a supervisor that
/// restarts it would meet the same refusal, so the code says "config").
fn refuse(why: &str) -> ! {
    eprintln!("pollbox: log: {why}; refusing to start");
    std::process::exit(LOG_REFUSED_EXIT)
}
