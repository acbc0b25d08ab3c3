//! The Kafka log (docs/operations.md#the-kafka-log): the client around
//! [`pollbox_core::log`]. With `[log] brokers` set, the topic is the source of
//! truth and this node a replica of the boxes built from it.
//!
//! One module per thread, and what they share below them:
//!
//! - `consume`: the consuming threads (`pollbox-log`, `pollbox-log-N`),
//!   each with its own client and its share of the partitions, read the
//!   topic from the offsets the snapshot holds (the log's start without
//!   one), hand each record to their own core's
//!   [`Replica`](pollbox_core::log::Replica) and wake the long-polls and
//!   event streams of the key, as an HTTP ingest does. They never take a
//!   lock a poll needs: polls go on while they apply.
//! - `produce`: on the workers, what this node's clients ingest goes to
//!   the topic, a request's records as one batch a partition, each tagged
//!   with the connection that awaits it.
//! - `deliveries`: the delivery thread (`pollbox-acks`) serves the
//!   producer client's events: delivery reports (each record's offset meets
//!   its apply) and the client's errors.
//! - `ends`: the log-end thread (`pollbox-log-end`) reads the log's end
//!   every second.
//! - `start`: starts them, and waits for them at shutdown.
//! - [`topic`]: what a node checks of its brokers and topic before it reads
//!   it (also `pollbox check-config`); `topic_id`: the topic's identity.
//! - `context`: what the threads share: where the node stands (`LogState`),
//!   each partition's handshake of an acknowledgement and its apply
//!   (`PartitionAcks`), the reports handed to the workers, the counters.
//!
//! What it is not: the rules of a record (the core's), or a consumer group:
//! every node reads every partition and commits nothing; its position lives
//! in its snapshot.

mod consume;
mod context;
mod deliveries;
mod ends;
mod presence;
mod produce;
mod start;
pub mod topic;
mod topic_id;

pub(crate) use context::{
    DeliveryTag, ErrorKind, LogState, PartitionState, PassReports, RecordResult, ACK_BUCKETS,
    REQUEST_MASK,
};
pub(crate) use produce::Producer;
pub(crate) use start::{spawn, LogParts, LogThreads};

use pollbox_core::config::LogConfig;
use rdkafka::config::ClientConfig;

/// The client properties of every pollbox client: the operator's
/// `[log.client]`, then the brokers.
pub(crate) fn client_config(cfg: &LogConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &cfg.client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &cfg.brokers);
    c
}

/// Exit code of a node whose snapshot the log cannot complete, or whose log
/// is misconfigured (EX_CONFIG): restarting it would not help.
const LOG_REFUSED_EXIT: i32 = 78;
