//! The consuming threads: every partition of the topic, from where the
//! snapshot left it, applied in partition order and waking whoever waits on
//! the keys. The first thread reads where each partition starts, then
//! starts the others (`log.consumers`); thread `k` of `n` owns the
//! partitions `p` with `p % n == k` (assigned, not subscribed), with its own
//! client and [`Replica`], so a key's records (one partition) are applied
//! in order by one thread. After each record a thread hands this node's
//! acknowledged records at that offset to their workers (`acks.rs`). See
//! the module above for what they share; [`Consuming`] is what they are
//! handed.

use super::produce::Producer;
use super::reports::PassReports;
use super::topic::{self, LogProblem};
use super::{client_config, LogState, PartitionState, LOG_REFUSED_EXIT, RESULTS};
use crate::lifecycle::Lifecycle;
use crate::wakeups::Waiters;
use pollbox_core::config::LogConfig;
use pollbox_core::log::{Outcome, Record, Replica};
use pollbox_core::service::Node;
use rdkafka::client::Client;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one wait for records lasts: the thread checks for shutdown (and
/// refreshes the log's end) at least this often.
const POLL: Duration = Duration::from_millis(100);
/// Records applied in one pass at most: a pass ends when the client's queue
/// is empty, or after this many records (a replay's queue is never empty),
/// and then the workers learn what it applied.
const PASS_RECORDS: u32 = 256;
/// How often the log's end is read again for the lag.
const END_EVERY: Duration = Duration::from_secs(1);
/// Between two attempts to reach an unreachable log.
const RETRY: Duration = Duration::from_secs(1);
/// One metadata or watermark request.
const REQUEST: Duration = Duration::from_secs(5);
/// The group id the client needs to be assigned partitions; nothing is
/// committed under it (each node's position is in its snapshot).
const GROUP: &str = "pollbox-replica";

/// A consumer that is assigned partitions (no group membership, no commits)
/// and reads only committed records (a transactional producer's aborted
/// records never reach the boxes).
pub fn consumer(cfg: &LogConfig) -> KafkaResult<BaseConsumer> {
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
    c.create()
}

/// What the consuming threads read, apply to, wake and report to, handed
/// over by the server (each part is owned by its module and shared).
pub struct Consuming {
    /// The config, the plan and the box table records are applied to.
    pub node: Arc<Node>,
    /// Where the node stands in the log: this thread moves it.
    pub log: Arc<LogState>,
    /// Who waits on a key, and the workers records produced here are
    /// reported to.
    pub waiters: Arc<Waiters>,
    /// Draining (the log's start is no longer waited for) and the workers
    /// stopped (the thread ends).
    pub lifecycle: Arc<Lifecycle>,
    /// The node's producer: its delivery reports are served by a thread of
    /// their own, and its client reads the log's end.
    pub producer: Option<Arc<Producer>>,
}

/// Start the consuming thread, and beside it the one that reads the log's
/// end every second (for the lag; a request to the broker that the consuming
/// thread would otherwise wait for between records) and the one that serves
/// the producer's delivery reports (produce.rs).
pub fn spawn(consuming: Consuming) -> io::Result<JoinHandle<()>> {
    let c = Arc::new(consuming);
    let ends = c.clone();
    std::thread::Builder::new()
        .name("pollbox-log-end".into())
        .spawn(move || watch_ends(&ends))?;
    if let Some(p) = c.producer.clone() {
        let acks = c.clone();
        std::thread::Builder::new()
            .name("pollbox-acks".into())
            .spawn(move || p.serve_acks(&acks.log, &acks.waiters, || done(&acks)))?;
    }
    std::thread::Builder::new()
        .name("pollbox-log".into())
        .spawn(move || run(&c))
}

/// Read the log's end every [`END_EVERY`] until shutdown, with the
/// producer's client (it fetches nothing, so it answers at once; a third
/// client would add its threads and connections to an idle node).
fn watch_ends(c: &Consuming) {
    crate::thread_priority::lower_priority("log end");
    let log = &*c.log;
    let mut fatal_said = false;
    while !done(c) && !log.halted() {
        std::thread::sleep(END_EVERY);
        if let Some(p) = &c.producer {
            read_ends(p.client(), log);
            // An idempotent producer can fail for good (librdkafka's fatal
            // error): every ingest is then 503 at once. Said once, plainly.
            if let (false, Some((code, reason))) = (fatal_said, p.client().fatal_error()) {
                eprintln!(
                    "pollbox: log: the producer failed for good ({code:?}: {reason}); every ingest on this node is 503 until it restarts"
                );
                fatal_said = true;
            }
        }
    }
}

/// A log line said once, until something else is said, and at most one line
/// in [`QUIET`] (a log down for an hour, its client alternating between two
/// errors, is a few lines, not thousands).
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

/// Shutting down: the log's start is no longer waited for.
fn stopping(c: &Consuming) -> bool {
    c.lifecycle.is_draining()
}

/// The workers have drained: nobody waits for a record any more.
fn done(c: &Consuming) -> bool {
    c.lifecycle.workers_stopped()
}

fn run(c: &Arc<Consuming>) {
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
    // Where each partition starts, once the log answers.
    let Some(starts) = starting_offsets(c, &client, &mut said) else {
        return; // shut down before the log answered
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cfg.consuming_threads(starts.len(), cores);
    if threads > 1 {
        eprintln!(
            "pollbox: log: {threads} consuming threads, partition p applied by thread p % {threads}"
        );
    }
    let mut others = Vec::with_capacity(threads - 1);
    for k in 1..threads {
        let (c, starts) = (c.clone(), starts.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("pollbox-log-{k}"))
            .spawn(move || {
                crate::thread_priority::lower_priority("log");
                let client = match consumer(&c.node.config.log) {
                    Ok(client) => client,
                    Err(e) => refuse(&format!("cannot create the Kafka client: {e}")),
                };
                apply(&c, &client, &starts, Share { k, of: threads });
            });
        match spawned {
            Ok(h) => others.push(h),
            Err(e) => refuse(&format!("cannot start consuming thread {k}: {e}")),
        }
    }
    apply(c, &client, &starts, Share { k: 0, of: threads });
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

/// Apply the partitions of `share` from `starts` until the workers stop (or
/// the log halts).
fn apply(c: &Consuming, consumer: &BaseConsumer, starts: &[i64], share: Share) {
    let log = &*c.log;
    let mut said = Throttled::default();
    let mut misplaced = Misplaced::default();
    let mut tpl = TopicPartitionList::new();
    for (p, &next) in starts.iter().enumerate().filter(|(p, _)| share.owns(*p)) {
        if let Err(e) = tpl.add_partition_offset(&log.topic, p as i32, Offset::Offset(next)) {
            refuse(&format!("cannot assign partition {p}: {e}"));
        }
    }
    if let Err(e) = consumer.assign(&tpl) {
        refuse(&format!("cannot assign the topic's partitions: {e}"));
    }
    let mut replica = Replica::new(
        c.node.plan.clone(),
        c.node.config.limits.arena_limit_bytes,
        starts.len() as u32,
    );
    // The table's lanes are the topic's partitions: a watermark means the
    // same on every node of the log (docs/boxes.md#watermarks).
    c.node
        .boxes
        .lanes()
        .for_partitions(starts.len(), topic_run(&log.topic));
    for (p, &next) in starts.iter().enumerate().filter(|(p, _)| share.owns(*p)) {
        c.node
            .boxes
            .lanes()
            .restored(p, u64::try_from(next).unwrap_or(0));
    }
    let mut key = Vec::with_capacity(256);
    if log.catch_up() {
        eprintln!("pollbox: log: caught up (nothing to replay)");
    }
    let mut pass = PassReports::new(c.waiters.workers());
    let mut counts = Counts::default();
    // A pass goes on without waiting while records are queued; it ends, and
    // the workers learn what it applied, when the queue is empty.
    let mut wait = POLL;
    while !done(c) && !log.halted() {
        let polled = consumer.poll(wait);
        match polled {
            None => {
                pass.hand_over(&c.waiters);
                counts.flush(log);
                wait = POLL;
            }
            Some(Err(e)) => {
                pass.hand_over(&c.waiters);
                counts.flush(log);
                wait = POLL;
                log.consume_errors.fetch_add(1, Ordering::Relaxed);
                log.connected.store(false, Ordering::Relaxed);
                said.say(format!("consuming: {e} (retrying)"));
            }
            Some(Ok(m)) => {
                // Written only when it changes: every consuming thread
                // reads it a record, and a store a record would bounce its
                // cache line between them.
                if !log.connected.load(Ordering::Relaxed) {
                    log.connected.store(true, Ordering::Relaxed);
                }
                let rec = Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis().unwrap_or_else(wall_ms),
                    key: m.key(),
                    value: m.payload(),
                };
                // Its waiters are woken as an HTTP ingest's are.
                let outcome = replica.apply(&c.node.boxes, &rec, &mut key, &mut &*c.waiters);
                if outcome == Outcome::Replayed && log.caught_up() {
                    // Not a replay: after the catch-up every record is new.
                    counts.add(log, "out_of_order");
                    said.say(format!(
                        "the record at {}/{} offset {} is older than its box {:?}; skipped",
                        log.topic,
                        rec.partition,
                        rec.offset,
                        String::from_utf8_lossy(&key)
                    ));
                } else {
                    counts.add(log, outcome.label());
                }
                match &outcome {
                    Outcome::WrongPartition { home } => {
                        misplaced.say(&log.topic, &rec, &key, *home, starts.len());
                    }
                    Outcome::Invalid(why) => eprintln!(
                        "pollbox: log: skipped the record at {}/{} offset {}: {}",
                        log.topic,
                        rec.partition,
                        rec.offset,
                        why.describe(&c.node.plan)
                    ),
                    _ => {}
                }
                if let Some(p) = log
                    .partitions()
                    .and_then(|ps| ps.get(rec.partition as usize))
                {
                    // Its outcome written down (if not "applied") before the
                    // partition moves past it, then whoever of this node's
                    // connections waits on it, acknowledged, is told
                    // (acks.rs: SeqCst on both sides).
                    p.acks.applied(rec.offset, outcome.report());
                    let next = rec.offset + 1;
                    p.next.fetch_max(next, Ordering::SeqCst);
                    p.acks.moved(next, |t, r, produced| {
                        log.ack.observe_ns(produced.elapsed().as_nanos() as u64);
                        pass.add(t.worker, t.request, t.index, r);
                    });
                }
                if !log.caught_up() && log.catch_up() {
                    eprintln!("pollbox: log: caught up; ready");
                }
                if pass.records() >= PASS_RECORDS {
                    pass.hand_over(&c.waiters);
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
    pass.hand_over(&c.waiters);
    counts.flush(log);
}

/// Records by result, counted on the thread and added to the log's counters
/// when a pass hands over (an atomic add a record, shared by every consuming
/// thread, would bounce its cache line between them).
#[derive(Default)]
struct Counts([u64; RESULTS.len()]);

impl Counts {
    fn add(&mut self, log: &LogState, result: &str) {
        match RESULTS.iter().position(|r| *r == result) {
            Some(i) => self.0[i] += 1,
            None => log.count(result),
        }
    }

    fn held(&self) -> u64 {
        self.0.iter().sum()
    }

    fn flush(&mut self, log: &LogState) {
        for (n, total) in self.0.iter_mut().zip(&log.records) {
            if *n > 0 {
                total.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
    }
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

/// The offsets each partition starts from: the snapshot's, else the log's
/// start. A snapshot the log can no longer complete (retention removed the
/// records after its offsets) is refused, naming the partitions; so is a
/// node without a snapshot on a log whose start is gone. Retries (and stays
/// unready) while the log cannot be reached.
fn starting_offsets(
    c: &Consuming,
    consumer: &BaseConsumer,
    said: &mut Throttled,
) -> Option<Vec<i64>> {
    let (log, cfg) = (&*c.log, &c.node.config.log);
    loop {
        if stopping(c) {
            return None;
        }
        match topic::check(cfg) {
            Ok(info) => {
                let found = info.settings.unsafe_settings();
                if !found.is_empty() {
                    log.set_unsafe_topic();
                    eprintln!(
                        "pollbox: log: WARNING: {}; taken because log.allow_unsafe_topic = true (development only)",
                        LogProblem::Unsafe {
                            topic: log.topic.clone(),
                            found
                        }
                    );
                }
            }
            Err(p) if p.is_fatal() => refuse(&p.to_string()),
            Err(p) => {
                log.connected.store(false, Ordering::Relaxed);
                log.start_failed();
                said.say(format!(
                    "{p}; serving the snapshot's boxes, not ready, retrying"
                ));
                std::thread::sleep(RETRY);
                continue;
            }
        }
        match watermarks(consumer, &log.topic) {
            Ok(marks) => {
                log.connected.store(true, Ordering::Relaxed);
                let loaded = log.loaded.as_ref();
                let mut starts = Vec::with_capacity(marks.len());
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
                    starts.push(from);
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
                let from = match loaded {
                    Some(l) => format!("the snapshot's offsets ({l})"),
                    None => "the log's start (no snapshot)".to_string(),
                };
                eprintln!(
                    "pollbox: log: {} partitions of {}; replaying from {from} up to the end at start ({})",
                    marks.len(),
                    log.topic,
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
                        .zip(&starts)
                        .map(|(&(_, high), &next)| PartitionState::new(next, high))
                        .collect(),
                );
                return Some(starts);
            }
            Err(e) => {
                log.connected.store(false, Ordering::Relaxed);
                log.start_failed();
                said.say(format!(
                    "cannot read topic {} from {}: {e}; serving the snapshot's boxes, not ready, retrying",
                    log.topic, c.node.config.log.brokers
                ));
                std::thread::sleep(RETRY);
            }
        }
    }
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

/// Read with a second client, assigned nothing: asked of the consuming
/// client, a watermark request waits behind its fetches.
/// Read the log's end of each partition (for the lag); whether that worked
/// says whether the log is there, records or not. A partition count other
/// than the one the node started with halts it: a key's home partition
/// would move, and the records of the new partitions would be read by no
/// one.
fn read_ends<C: ClientContext>(reader: &Client<C>, log: &LogState) {
    let Some(parts) = log.partitions() else {
        return;
    };
    if let Ok(md) = reader.fetch_metadata(Some(&log.topic), REQUEST) {
        let now = md
            .topics()
            .iter()
            .find(|t| t.name() == log.topic)
            .map_or(0, |t| t.partitions().len());
        if now != 0 && now != parts.len() {
            log.halt(format!(
                "topic {} now has {now} partitions, not the {} it had when this node started: a key's home partition (murmur2 of the key modulo the count) moved, so records of one key are in two partitions. The partition count is fixed for the topic's life: recreate the topic with the count it needs and replay the nodes from it",
                log.topic,
                parts.len()
            ));
            return;
        }
    }
    let mut reached = true;
    for (p, state) in parts.iter().enumerate() {
        match reader.fetch_watermarks(&log.topic, p as i32, REQUEST) {
            Ok((_, high)) => state.end.store(high, Ordering::Relaxed),
            Err(_) => reached = false,
        }
    }
    log.connected.store(reached, Ordering::Relaxed);
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

/// The run of a topic's watermarks: FNV-1a of its name, the same on every
/// node (docs/boxes.md#watermarks).
fn topic_run(topic: &str) -> u64 {
    topic.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
