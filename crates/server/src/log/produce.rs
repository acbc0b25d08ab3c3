//! Producing what this node's clients ingest: one record per accepted message
//! (the box key as the record key, in the key's home partition, murmur2 as
//! Kafka's default partitioner puts it whoever produces; the message's bytes
//! as the value; a `DELETE` a tombstone), acknowledged by every in-sync
//! replica (`acks=all`) and written once (`enable.idempotence`).
//!
//! A request's records are produced as batches: one `rd_kafka_produce_batch`
//! a partition, one lock of the client's queue and one wake-up of its
//! thread, not one of each a message. Each record's delivery report brings
//! back its partition and offset, and its [`Ticket`] (the report's opaque
//! value: nothing is added to the record); [`Producer::serve_acks`] meets
//! them with the apply of that offset ([`super::acks`]). A record the log
//! does not take is reported `Failed`.

use super::acks::Ticket;
use super::reports::PassReports;
use super::LogState;
use crate::wakeups::{LogReport, Waiters};
use pollbox_core::config::LogConfig;
use pollbox_core::log::home_partition;
use pollbox_core::service::{LogRecord, Report};
use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::error::KafkaResult;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the acknowledging thread waits for a delivery report before it
/// looks whether the node stops.
const ACK_WAIT_MS: i32 = 250;

/// librdkafka's `RD_KAFKA_PARTITION_UA` (a C macro the bindings lack): the
/// configured partitioner places each record.
const PARTITION_UA: i32 = -1;

/// Delivery reports the client serves itself, when the producer is dropped
/// (the node stops; [`Producer::serve_acks`] serves them before): a record
/// the log did not take is counted and reported `Failed`.
pub struct Deliveries {
    log: Arc<LogState>,
    waiters: Arc<Waiters>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, r: &DeliveryResult<'_>, opaque: usize) {
        if r.is_ok() {
            return;
        }
        self.log.produce_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = Ticket::decode(opaque) {
            self.waiters.report(
                t.worker as usize,
                LogReport {
                    request: t.request,
                    index: t.index,
                    report: Report::Failed,
                    count: 1,
                },
            );
        }
    }
}

/// The node's producer. Its delivery reports are served by a thread of
/// their own ([`Producer::serve_acks`]), which reads the client's queue
/// event by event (a produce request's records at a time).
pub struct Producer {
    // Before `inner`: fields drop in order, and the topic's handle is
    // released before its client.
    topic: Topic,
    inner: BaseProducer<Deliveries>,
}

/// The client's handle of the topic (`rd_kafka_produce_batch` takes one).
struct Topic(*mut rd::rd_kafka_topic_t);

// SAFETY: librdkafka's topic handles may be used from any thread (its
// produce calls lock what they share); this one is only read.
unsafe impl Send for Topic {}
// SAFETY: as above.
unsafe impl Sync for Topic {}

impl Drop for Topic {
    fn drop(&mut self) {
        // SAFETY: the handle came from rd_kafka_topic_new and is released
        // once, here, before its client (Producer declares it first).
        unsafe { rd::rd_kafka_topic_destroy(self.0) }
    }
}

impl Producer {
    /// The producer of a node: `log` counts the records the log did not take,
    /// `waiters` carries their failure to the worker waiting.
    pub fn new(
        cfg: &LogConfig,
        log: Arc<LogState>,
        waiters: Arc<Waiters>,
    ) -> KafkaResult<Producer> {
        let mut c = super::client_config(cfg);
        // murmur2, as Kafka's Java client and most others partition keyed
        // records: a key's records land in one partition whoever produces
        // them (librdkafka's own default hashes with CRC32). Its versions come
        // from that partition's offsets. (A batch names its partition; this
        // partitioner places the records produced before the topic's
        // partition count is known.)
        c.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random");
        if !cfg.client.contains_key("linger.ms") {
            // An ingest waits for its record: send at once (librdkafka's
            // default waits 5 ms to fill batches). A request's records are
            // queued together, so they go in one produce request all the same.
            c.set("linger.ms", "0");
        }
        // Every delivery report is needed: it brings the record's offset
        // (`delivery.report.only.error` would drop the taken ones'; it is
        // reserved, so `[log.client]` cannot set it).
        c.set("delivery.report.only.error", "false");
        if !cfg.client.contains_key("message.timeout.ms") {
            // Never give up on a record: the idempotent producer that gives
            // up on one in flight bumps its epoch and may send it again under
            // the new one, where the broker cannot see it is a duplicate
            // (librdkafka#4953; found by the fault suite, docs/reliability.md).
            // Its ingest is answered 503 at ack_timeout_ms all the same; the
            // record may still land later, once (at-least-once on a retry).
            // The client's queue is bounded (queue.buffering.max.*): past it
            // an ingest is 503 at once.
            c.set("message.timeout.ms", "0");
        }
        let inner: BaseProducer<Deliveries> = c.create_with_context(Deliveries { log, waiters })?;
        let name = CString::new(cfg.topic.as_str()).map_err(|_| {
            rdkafka::error::KafkaError::ClientCreation("the topic's name holds a NUL".into())
        })?;
        // SAFETY: the client is alive; librdkafka copies the name and
        // returns a handle (or NULL) that Topic releases.
        let topic = unsafe {
            rd::rd_kafka_topic_new(
                inner.client().native_ptr(),
                name.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        if topic.is_null() {
            return Err(rdkafka::error::KafkaError::ClientCreation(
                "the client refused a handle of the topic".into(),
            ));
        }
        Ok(Producer {
            inner,
            topic: Topic(topic),
        })
    }

    /// Produce `records` of `worker`'s `request`, each in its key's home
    /// partition of `partitions` (unknown yet: the client's murmur2
    /// partitioner places them). Returns how many the client took; the rest
    /// (its queue is full: the log is away or far behind) are not produced.
    pub fn send(
        &self,
        worker: u16,
        request: u64,
        records: &[LogRecord<'_>],
        partitions: Option<u32>,
    ) -> usize {
        let message = |r: &LogRecord<'_>| {
            // SAFETY: a plain C struct of pointers and integers, for which
            // all zeroes is the empty message.
            let mut m: rd::rd_kafka_message_t = unsafe { std::mem::zeroed() };
            if let Some(v) = r.value {
                m.payload = v.as_ptr() as *mut _;
                m.len = v.len();
            }
            m.key = r.key.as_ptr() as *mut _;
            m.key_len = r.key.len();
            m._private = Ticket {
                worker,
                request,
                index: r.index,
            }
            .encode() as *mut _;
            m
        };
        let Some(parts) = partitions.filter(|&n| n > 0) else {
            let mut ms: Vec<_> = records.iter().map(message).collect();
            return self.produce(PARTITION_UA, &mut ms);
        };
        // By partition, each in the request's order (a key's records keep
        // theirs): a counting sort.
        let homes: Vec<u32> = records
            .iter()
            .map(|r| home_partition(r.key, parts) as u32)
            .collect();
        let mut starts = vec![0usize; parts as usize + 1];
        for &h in &homes {
            starts[h as usize + 1] += 1;
        }
        for p in 0..parts as usize {
            starts[p + 1] += starts[p];
        }
        let mut at = starts.clone();
        // SAFETY: as in `message`: all zeroes is an empty message.
        let mut ms: Vec<rd::rd_kafka_message_t> = (0..records.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (r, &h) in records.iter().zip(&homes) {
            ms[at[h as usize]] = message(r);
            at[h as usize] += 1;
        }
        let mut taken = 0;
        for p in 0..parts as usize {
            let run = &mut ms[starts[p]..starts[p + 1]];
            if !run.is_empty() {
                taken += self.produce(p as i32, run);
            }
        }
        taken
    }

    /// One `rd_kafka_produce_batch` of `ms` to `partition`: how many it took.
    fn produce(&self, partition: i32, ms: &mut [rd::rd_kafka_message_t]) -> usize {
        let Ok(n) = i32::try_from(ms.len()) else {
            return 0;
        };
        // SAFETY: the topic handle lives as long as self; each message points
        // at a key and value that outlive this call, and RD_KAFKA_MSG_F_COPY
        // has librdkafka copy them before it returns. It writes only the
        // messages' `err`.
        let took = unsafe {
            rd::rd_kafka_produce_batch(
                self.topic.0,
                partition,
                rd::RD_KAFKA_MSG_F_COPY,
                ms.as_mut_ptr(),
                n,
            )
        };
        usize::try_from(took).unwrap_or(0)
    }

    /// Serve the delivery reports until `done`: a taken record meets its
    /// apply ([`super::acks`]), one the log did not take is reported
    /// `Failed`; the workers learn a report's outcomes with one wake-up
    /// each. Its wait is librdkafka's (a condition variable): an idle node
    /// spends nothing here but a look every [`ACK_WAIT_MS`].
    pub fn serve_acks(&self, log: &LogState, waiters: &Waiters, done: impl Fn() -> bool) {
        // SAFETY: a new reference to the client's main queue, where its
        // delivery reports go (rdkafka sets the DR event); released below.
        let queue = unsafe { rd::rd_kafka_queue_get_main(self.inner.client().native_ptr()) };
        let mut pass = PassReports::new(waiters.workers());
        let mut held: Vec<(i32, i64, Ticket, Instant)> = Vec::new();
        let mut msgs: Vec<*const rd::rd_kafka_message_t> = Vec::new();
        while !done() {
            let wait = if held.is_empty() { ACK_WAIT_MS } else { 1 };
            // SAFETY: the queue is alive; the event returned (or NULL) is
            // destroyed below, and the messages read from it before that.
            let ev = unsafe { rd::rd_kafka_queue_poll(queue, wait) };
            if !ev.is_null() {
                // SAFETY: as above.
                unsafe {
                    if rd::rd_kafka_event_type(ev) == rd::RD_KAFKA_EVENT_DR {
                        let now = Instant::now();
                        let n = rd::rd_kafka_event_message_count(ev);
                        msgs.clear();
                        msgs.reserve(n);
                        let got = rd::rd_kafka_event_message_array(ev, msgs.as_mut_ptr(), n);
                        msgs.set_len(got.min(n));
                        for &m in &msgs {
                            let m = &*m;
                            let Some(t) = Ticket::decode(m._private as usize) else {
                                continue;
                            };
                            if m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                                log.produce_errors.fetch_add(1, Ordering::Relaxed);
                                pass.add(t.worker, t.request, t.index, Report::Failed);
                                continue;
                            }
                            // librdkafka's time from the produce call to
                            // this report: when the record was produced.
                            let us = u64::try_from(rd::rd_kafka_message_latency(m)).unwrap_or(0);
                            let produced =
                                now.checked_sub(Duration::from_micros(us)).unwrap_or(now);
                            held.push((m.partition, m.offset, t, produced));
                        }
                    }
                    rd::rd_kafka_event_destroy(ev);
                }
            }
            // Before the topic's partitions are known nothing is applied:
            // the acknowledgements wait here until they are.
            if let Some(parts) = log.partitions() {
                // A report's records come a partition at a time: each run
                // meets its partition's applies under one lock.
                let now = Instant::now();
                let mut report = |t: Ticket, r: Report, produced: Instant| {
                    let waited = now.saturating_duration_since(produced);
                    log.ack.observe_ns(waited.as_nanos() as u64);
                    pass.add(t.worker, t.request, t.index, r);
                };
                for run in held.chunk_by(|a, b| a.0 == b.0) {
                    let Some(part) = usize::try_from(run[0].0).ok().and_then(|p| parts.get(p))
                    else {
                        for &(_, _, t, produced) in run {
                            report(t, Report::Failed, produced);
                        }
                        continue;
                    };
                    part.acks.acknowledged(
                        run.iter()
                            .map(|&(_, offset, t, produced)| (offset, t, produced)),
                        || part.next.load(Ordering::SeqCst),
                        &mut report,
                    );
                }
                held.clear();
            }
            pass.hand_over(waiters);
        }
        // SAFETY: the reference taken above, released once.
        unsafe { rd::rd_kafka_queue_destroy(queue) };
    }

    /// The client, for requests that are not records (the log's end, the
    /// partition count): a consumer would answer them behind its fetches.
    pub fn client(&self) -> &Client<Deliveries> {
        self.inner.client()
    }
}
