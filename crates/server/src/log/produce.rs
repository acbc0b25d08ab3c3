//! Producing what this node's clients ingest: one record per accepted message
//! (the box key as the record key, so Kafka's default partitioner puts a key's
//! records in one partition whoever produces them; the message's bytes as the
//! value; a `DELETE` a tombstone), acknowledged by every in-sync replica
//! (`acks=all`) and written once (`enable.idempotence`).
//!
//! Each record carries a [`TICKET`] header naming this process, the worker
//! and the request: when this node's consuming thread applies the record it
//! reports the outcome to that worker, whose connection then answers. A
//! record the log does not take in time is reported `Failed` by the delivery
//! report. Other nodes, and any other consumer, ignore the header.

use super::LogState;
use crate::wakeups::{LogReport, Waiters};
use pollbox_core::config::LogConfig;
use pollbox_core::service::{LogUnavailable, Report};
use rdkafka::client::Client;
use rdkafka::error::KafkaResult;
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The header that routes a record's outcome back to its connection.
pub const TICKET: &str = "pollbox-ticket";

/// Where a record's outcome goes: this process, a worker, its request and
/// the record's place in it; and when it was produced (ns on the server's
/// clock), for the acknowledgement latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub node: u64,
    pub worker: u16,
    pub request: u64,
    pub index: u32,
    pub sent_ns: u64,
}

impl Ticket {
    const LEN: usize = 8 + 2 + 8 + 4 + 8;

    pub fn encode(&self) -> [u8; Ticket::LEN] {
        let mut b = [0u8; Ticket::LEN];
        b[..8].copy_from_slice(&self.node.to_le_bytes());
        b[8..10].copy_from_slice(&self.worker.to_le_bytes());
        b[10..18].copy_from_slice(&self.request.to_le_bytes());
        b[18..22].copy_from_slice(&self.index.to_le_bytes());
        b[22..].copy_from_slice(&self.sent_ns.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Ticket> {
        let b: &[u8; Ticket::LEN] = b.try_into().ok()?;
        let (node, rest) = b.split_at(8);
        let (worker, rest) = rest.split_at(2);
        let (request, rest) = rest.split_at(8);
        let (index, sent_ns) = rest.split_at(4);
        Some(Ticket {
            node: u64::from_le_bytes(node.try_into().ok()?),
            worker: u16::from_le_bytes(worker.try_into().ok()?),
            request: u64::from_le_bytes(request.try_into().ok()?),
            index: u32::from_le_bytes(index.try_into().ok()?),
            sent_ns: u64::from_le_bytes(sent_ns.try_into().ok()?),
        })
    }

    /// The ticket a record carries, if it has one.
    pub fn of(headers: Option<&rdkafka::message::BorrowedHeaders>) -> Option<Ticket> {
        let h = headers?;
        h.iter()
            .find(|h| h.key == TICKET)
            .and_then(|h| h.value)
            .and_then(Ticket::decode)
    }
}

/// Delivery reports: a record the log did not take is counted in the log's
/// state and reported `Failed` to the worker waiting for it, through the
/// waiters (a taken one is reported when it is applied).
pub struct Deliveries {
    log: Arc<LogState>,
    waiters: Arc<Waiters>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        use rdkafka::Message;
        let Err((_, m)) = r else {
            return;
        };
        self.log.produce_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = Ticket::of(m.headers()) {
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

/// The node's producer. Its delivery reports are served by the consuming
/// thread between two polls of the log ([`Producer::serve_deliveries`]),
/// not by a thread of its own: rdkafka's `ThreadedProducer` polls every
/// 100 ms and spins through the last millisecond of each wait, most of an
/// idle node's CPU (BENCHMARKS.md, "The Kafka log").
pub struct Producer {
    inner: BaseProducer<Deliveries>,
    node: u64,
}

impl Producer {
    /// The producer of a node: `log` counts the records the log did not take
    /// (its `node`: this process's id in tickets), `waiters` carries their
    /// failure to the worker waiting.
    pub fn new(
        cfg: &LogConfig,
        log: Arc<LogState>,
        waiters: Arc<Waiters>,
    ) -> KafkaResult<Producer> {
        let node = log.node;
        let mut c = super::client_config(cfg);
        // murmur2, as Kafka's Java client and most others partition keyed
        // records: a key's records land in one partition whoever produces
        // them (librdkafka's own default hashes with CRC32). Its versions come
        // from that partition's offsets.
        c.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random");
        if !cfg.client.contains_key("linger.ms") {
            // An ingest waits for its record: send at once (librdkafka's
            // default waits 5 ms to fill batches).
            c.set("linger.ms", "0");
        }
        if !cfg.client.contains_key("delivery.report.only.error") {
            // A taken record is reported when this node applies it: its
            // delivery report would only be served and dropped, one event a
            // record on the consuming thread. The client frees it on the
            // broker's acknowledgement instead.
            c.set("delivery.report.only.error", "true");
        }
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
        let inner = c.create_with_context(Deliveries { log, waiters })?;
        Ok(Producer { inner, node })
    }

    /// Produce one record for `ticket` (its node is filled in). `Err`: the
    /// client's queue is full (the log is away or far behind).
    pub fn send(
        &self,
        topic: &str,
        mut ticket: Ticket,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), LogUnavailable> {
        ticket.node = self.node;
        let t = ticket.encode();
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: TICKET,
            value: Some(&t[..]),
        });
        let mut rec: BaseRecord<'_, [u8], [u8], ()> =
            BaseRecord::to(topic).key(key).headers(headers);
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        self.inner.send(rec).map_err(|_| LogUnavailable)
    }

    /// Hand every delivery report that came in to its worker (a record the
    /// log did not take is reported `Failed`; a taken one has none unless
    /// `[log.client]` asks for every report, and then it only leaves the
    /// client's queue, which counts records until their report is served:
    /// left there, it fills and every ingest is 503). Never waits. One poll
    /// serves one event (a produce request's records); it goes on while the
    /// queue shrinks.
    pub fn serve_deliveries(&self) {
        let mut queued = self.inner.in_flight_count();
        loop {
            self.inner.poll(Duration::ZERO);
            let now = self.inner.in_flight_count();
            if now >= queued {
                return;
            }
            queued = now;
        }
    }

    /// The client, for requests that are not records (the log's end, the
    /// partition count): a consumer would answer them behind its fetches.
    pub fn client(&self) -> &Client<Deliveries> {
        self.inner.client()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_round_trips_and_anything_else_is_none() {
        let t = Ticket {
            node: 0xdead_beef_0123,
            worker: 7,
            request: 1 << 40,
            index: 99,
            sent_ns: 123_456_789,
        };
        assert_eq!(Ticket::decode(&t.encode()), Some(t));
        assert_eq!(Ticket::decode(b"short"), None);
        assert_eq!(Ticket::decode(&[0; 23]), None);
    }
}
