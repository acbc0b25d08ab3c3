//! The `pollbox-log-end` thread: every second it reads the log's end of
//! each partition (the lag) and the topic's partition count, with the
//! producer's client (it fetches nothing, so it answers at once; a third
//! client would add its threads and connections to an idle node). Whether
//! that worked says whether the log is there, records or not
//! (`pollbox_log_connected`).
//!
//! What it is not: the consuming threads, which would otherwise wait for
//! these requests between records.

use super::context::LogState;
use super::produce::Producer;
use crate::lifecycle::Lifecycle;
use std::sync::Arc;
use std::time::Duration;

/// How often the log's end is read again.
const EVERY: Duration = Duration::from_secs(1);
/// One metadata or watermark request.
const REQUEST: Duration = Duration::from_secs(5);

/// What the log-end thread is handed.
pub(crate) struct Ends {
    pub(crate) producer: Arc<Producer>,
    pub(crate) log: Arc<LogState>,
    /// The workers stopped: the thread ends.
    pub(crate) lifecycle: Arc<Lifecycle>,
}

/// Read the log's end every [`EVERY`] until the workers stop or the node
/// halts.
pub(crate) fn follow(e: &Ends) {
    crate::thread_priority::lower_priority("log end");
    while !e.lifecycle.workers_stopped() && !e.log.halted() {
        std::thread::sleep(EVERY);
        read_ends(&e.producer, &e.log);
    }
}

/// Read the log's end of each partition, once the partitions are known. A
/// partition count other than the one the node started with halts it: a
/// key's home partition would move, and the records of the new partitions
/// would be read by no one.
fn read_ends(p: &Producer, log: &LogState) {
    let Some(parts) = log.partitions() else {
        return;
    };
    let reader = p.client();
    let topic = log.topic();
    if let Ok(md) = reader.fetch_metadata(Some(topic), REQUEST) {
        let now = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(0, |t| t.partitions().len());
        if now != 0 && now != parts.len() {
            log.halt(format!(
                "topic {topic} now has {now} partitions, not the {} it had when this node started: a key's home partition (murmur2 of the key modulo the count) moved, so records of one key are in two partitions. The partition count is fixed for the topic's life: recreate the topic with the count it needs and replay the nodes from it",
                parts.len()
            ));
            return;
        }
    }
    let mut reached = true;
    for (i, part) in parts.iter().enumerate() {
        match reader.fetch_watermarks(topic, i as i32, REQUEST) {
            Ok((_, high)) => part.set_end(high),
            Err(_) => reached = false,
        }
    }
    log.exchanged(reached);
}
