//! Producing what this node's clients ingest, on the worker that took the
//! request: one record per accepted message (the box key as the record key,
//! in the key's home partition, murmur2 as Kafka's default partitioner puts
//! it whoever produces; the message's bytes as the value; a `DELETE` a
//! tombstone), acknowledged by every in-sync replica (`acks=all`) and
//! written once (`enable.idempotence`).
//!
//! A request's records are produced as batches ([`group_by_home`]): one
//! `rd_kafka_produce_batch` a partition, one lock of the client's queue and
//! one wake-up of its thread, not one of each a message. Each record carries
//! its [`DeliveryTag`] as the delivery report's opaque value (nothing is
//! added to the record).
//!
//! What it is not: the delivery reports and the client's other events
//! (`deliveries.rs`, the `pollbox-acks` thread, polls this client's queue).

use super::context::{Client, DeliveryTag, LogState};
use pollbox_core::config::LogConfig;
use pollbox_core::log::home_partition;
use pollbox_core::service::LogRecord;
use rdkafka::bindings as rd;
use rdkafka::client::Client as KafkaClient;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;
use std::ffi::CString;
use std::sync::Arc;

/// librdkafka's `RD_KAFKA_PARTITION_UA` (a C macro the bindings lack): the
/// configured partitioner places each record.
const PARTITION_UA: i32 = -1;

/// The producer client's context: what the client serves itself rather
/// than through the `pollbox-acks` thread. That is only rdkafka's purge and
/// flush when the producer is dropped, after the thread has served the
/// last delivery reports (`deliveries.rs`): errors then go where the
/// thread's go; delivery reports find no connection awaiting them.
pub(crate) struct ProducerEvents {
    log: Arc<LogState>,
}

impl ClientContext for ProducerEvents {
    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        self.log.client_error(Client::Producer, code, false, reason);
    }
}

impl ProducerContext for ProducerEvents {
    type DeliveryOpaque = usize;

    /// The workers have stopped (see the type's doc): nobody awaits it.
    fn delivery(&self, _: &DeliveryResult<'_>, _: usize) {}
}

/// The node's producer.
pub(crate) struct Producer {
    // Before `inner`: fields drop in order, and the topic's handle is
    // released before its client.
    topic: Topic,
    inner: BaseProducer<ProducerEvents>,
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
    /// The producer of a node; `log` counts its client's errors.
    pub(crate) fn new(cfg: &LogConfig, log: Arc<LogState>) -> KafkaResult<Producer> {
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
            // An ingest awaits its record: send at once (librdkafka's
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
        let inner: BaseProducer<ProducerEvents> = c.create_with_context(ProducerEvents { log })?;
        let name = CString::new(cfg.topic.as_str())
            .map_err(|_| KafkaError::ClientCreation("the topic's name holds a NUL".into()))?;
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
            return Err(KafkaError::ClientCreation(
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
    pub(crate) fn send(
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
            m._private = DeliveryTag {
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
        let homes: Vec<u32> = records
            .iter()
            .map(|r| home_partition(r.key, parts) as u32)
            .collect();
        let groups = group_by_home(&homes, parts as usize);
        let mut ms: Vec<rd::rd_kafka_message_t> =
            groups.order.iter().map(|&i| message(&records[i])).collect();
        let mut taken = 0;
        for (p, run) in groups.runs() {
            taken += self.produce(p as i32, &mut ms[run]);
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

    /// The client: its queue of events (`deliveries.rs`), and requests that
    /// are not records (the log's end, the partition count: a consumer would
    /// answer them behind its fetches).
    pub(crate) fn client(&self) -> &KafkaClient<ProducerEvents> {
        self.inner.client()
    }

    /// Fail what the client still holds, queued or in flight: their
    /// delivery reports come at once (the node stops).
    pub(crate) fn purge(&self) {
        self.inner.purge(PurgeConfig::default().queue().inflight());
    }

    /// Records the client holds: queued, in flight, or their delivery
    /// reports not served yet.
    pub(crate) fn in_flight(&self) -> i32 {
        self.inner.in_flight_count()
    }
}

/// A request's records grouped by their home partition, each group in the
/// request's order (a key's records keep theirs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Groups {
    /// The records' indices, partition 0's first.
    order: Vec<usize>,
    /// Where each partition's run starts in `order`; one more at the end.
    starts: Vec<usize>,
}

impl Groups {
    /// Each partition that has records, and where its run is in `order`.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        self.starts
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] < w[1])
            .map(|(p, w)| (p, w[0]..w[1]))
    }
}

/// Group records whose home partitions are `homes` (each below
/// `partitions`) by partition: a stable counting sort.
pub(crate) fn group_by_home(homes: &[u32], partitions: usize) -> Groups {
    // Where each partition's run ends, then (filled from the back, so each
    // run keeps the request's order) where it starts.
    let mut starts = vec![0usize; partitions + 1];
    for &h in homes {
        starts[h as usize + 1] += 1;
    }
    for p in 0..partitions {
        starts[p + 1] += starts[p];
    }
    let mut order = vec![0usize; homes.len()];
    let mut at = starts[1..].to_vec();
    for (i, &h) in homes.iter().enumerate().rev() {
        at[h as usize] -= 1;
        order[at[h as usize]] = i;
    }
    Groups { order, starts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(g: &Groups) -> Vec<(usize, Vec<usize>)> {
        g.runs().map(|(p, r)| (p, g.order[r].to_vec())).collect()
    }

    #[test]
    fn records_are_grouped_by_home_partition_each_in_the_requests_order() {
        let g = group_by_home(&[2, 0, 2, 1, 0, 2], 4);
        assert_eq!(
            runs(&g),
            [(0, vec![1, 4]), (1, vec![3]), (2, vec![0, 2, 5])]
        );
        assert_eq!(g.starts, [0, 2, 3, 6, 6], "partition 3 has none");
    }

    #[test]
    fn one_partition_or_no_records_group_trivially() {
        assert_eq!(runs(&group_by_home(&[0, 0, 0], 1)), [(0, vec![0, 1, 2])]);
        assert!(runs(&group_by_home(&[], 8)).is_empty());
        assert_eq!(runs(&group_by_home(&[7], 8)), [(7, vec![0])]);
    }

    #[test]
    fn any_homes_group_to_a_permutation_sorted_by_partition_stably() {
        let mut x = 12345u64;
        for n in 0..200 {
            let parts = 1 + (n % 9);
            let homes: Vec<u32> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % parts as u64) as u32
                })
                .collect();
            let g = group_by_home(&homes, parts);
            let mut want: Vec<usize> = (0..homes.len()).collect();
            want.sort_by_key(|&i| homes[i]);
            assert_eq!(g.order, want, "{homes:?}");
            for (p, r) in g.runs() {
                assert!(g.order[r].iter().all(|&i| homes[i] as usize == p));
            }
        }
    }
}
