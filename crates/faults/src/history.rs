//! The history of a run: every operation the workload, the nemesis and the
//! final reads did, each with when it was invoked and completed and what came
//! back, written as JSON lines (`history.jsonl`, one [`Op`] a line). The
//! checker reads nothing else: a history written by one run can be checked
//! again later (`pollbox-faults check FILE`).
//!
//! What it is not: a log of the cluster's own output (brokers and nodes log
//! to their files in the run's folder).

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What an ingest (or a foreign record) came to, as the client can know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Taken: a 2xx with the box's new payload (a record: acknowledged).
    Ok,
    /// Certainly not taken: a 4xx, a refused connection, HAProxy's "no
    /// server available". The message must never be applied.
    Refused,
    /// May or may not be taken: a timeout, a reset after the request was
    /// sent, 503 "log unavailable", a 502/504 of the proxy.
    Indeterminate,
}

/// How a read was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadMode {
    /// `GET /v1/boxes/{key}`.
    Poll,
    /// `GET /v1/boxes/{key}?after=V&wait_ms=N`.
    LongPoll,
    /// One event of `Accept: text/event-stream`.
    Stream,
    /// The read of every key on every node once faults stopped.
    Final,
}

/// Whether a fault began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Start,
    End,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Microseconds since the run began, when it was invoked and when it
    /// completed (a read made after another completed has `t0` past its `t1`).
    pub t0: u64,
    pub t1: u64,
    /// Who did it: `w3` (a writer), `p-a0` (a poller of node a), `s-b0` (a
    /// stream), `m0` (a client moving between nodes), `nemesis`, `foreign`,
    /// `final`.
    pub process: String,
    #[serde(flatten)]
    pub event: Event,
}

/// What was done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "kebab-case")]
pub enum Event {
    /// The topic's partition count (a key's home partition depends on it).
    Topic { partitions: i32 },
    /// `POST /v1/boxes/{key}` with `{"value":value,"player":player}`, through
    /// `via` (a node's name, or `lb` for HAProxy).
    Ingest {
        via: String,
        /// The node's run (restarts) that answered, when it is certain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<u32>,
        key: String,
        value: i64,
        player: String,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// The 2xx answer: the box's payload.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A record written by a plain Kafka producer on librdkafka's default
    /// partitioner (not pollbox), with the partition and offset its
    /// acknowledgement named.
    Foreign {
        key: String,
        value: i64,
        player: String,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// What a read saw: `ver` 0 and no payload for a 404 (no box).
    Read {
        via: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<u32>,
        /// A connection, or a moving client's whole life: versions never go
        /// backwards within one.
        session: u64,
        /// A client that moves between nodes carrying `after` /
        /// `Last-Event-ID`.
        #[serde(default, skip_serializing_if = "is_false")]
        mover: bool,
        mode: ReadMode,
        key: String,
        /// The `after` / `Last-Event-ID` the request carried.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        ver: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<String>,
    },
    /// A fault begun or ended (`target`: `broker2`, `a`, `partition1`...).
    Fault {
        fault: String,
        target: String,
        phase: Phase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// One record of the topic, read from its start once faults stopped.
    Record {
        partition: i32,
        offset: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    /// A presence member's event stream
    /// (`GET /v1/boxes/{room}~presence?member={member}`) answered 200 by
    /// node `via`: the member is held there from then on, until the
    /// matching `presence-close`.
    PresenceOpen {
        member: String,
        room: String,
        via: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<u32>,
    },
    /// That stream ended: closed by the suite (`cause` "client"), or seen
    /// broken (`cause` "broken: ..."; it may have broken earlier, at worst
    /// at the open's completion, e.g. with a kill of its node).
    PresenceClose {
        member: String,
        room: String,
        via: String,
        cause: String,
    },
    /// A member's stream sent to node `via` and not answered (the node
    /// paused): the node may hold the member for a while once it runs again.
    PresenceUnanswered {
        member: String,
        room: String,
        via: String,
        error: String,
    },
    /// `GET /v1/boxes/{room}~presence` on node `via`: its status and body.
    /// `round`: a final read, once faults stopped and the cluster was quiet
    /// for more than a lease and the leave grace (1: every node up; 2: node
    /// b killed for good before it).
    PresenceRead {
        via: String,
        room: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        round: Option<u32>,
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<String>,
    },
    /// A node's metric, scraped once faults stopped.
    Metric {
        via: String,
        name: String,
        value: f64,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Where the operations of a run are recorded, from any thread: kept in
/// memory for the checker and written to the history file as they come.
#[derive(Clone)]
pub struct Recorder(Arc<Inner>);

struct Inner {
    start: Instant,
    state: Mutex<State>,
}

struct State {
    ops: Vec<Op>,
    out: Option<BufWriter<File>>,
}

impl Recorder {
    /// A recorder writing to `path` (created or truncated).
    pub fn to_file(path: &Path) -> io::Result<Recorder> {
        let out = BufWriter::new(File::create(path)?);
        Ok(Recorder::with(Some(out)))
    }

    /// A recorder that only keeps the operations in memory.
    pub fn in_memory() -> Recorder {
        Recorder::with(None)
    }

    fn with(out: Option<BufWriter<File>>) -> Recorder {
        Recorder(Arc::new(Inner {
            start: Instant::now(),
            state: Mutex::new(State {
                ops: Vec::new(),
                out,
            }),
        }))
    }

    /// Microseconds since the run began.
    pub fn now(&self) -> u64 {
        self.0.start.elapsed().as_micros() as u64
    }

    /// Record an operation invoked at `t0` and completed now.
    pub fn record(&self, t0: u64, process: &str, event: Event) {
        let op = Op {
            t0,
            t1: self.now(),
            process: process.to_string(),
            event,
        };
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(out) = s.out.as_mut() {
            // A history that cannot be written is a run that cannot be
            // checked later; the in-memory copy is still checked.
            if serde_json::to_writer(&mut *out, &op).is_ok() {
                let _ = out.write_all(b"\n");
            }
        }
        s.ops.push(op);
    }

    /// Record an instantaneous operation.
    pub fn note(&self, process: &str, event: Event) {
        self.record(self.now(), process, event);
    }

    /// Write what is buffered to the file.
    pub fn flush(&self) -> io::Result<()> {
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.out.as_mut() {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }

    /// Everything recorded so far, in the order recorded.
    pub fn ops(&self) -> Vec<Op> {
        let s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        s.ops.clone()
    }
}

/// Read a history file written by a [`Recorder`].
pub fn read(path: &Path) -> io::Result<Vec<Op>> {
    let f = io::BufReader::new(File::open(path)?);
    let mut ops = Vec::new();
    for (i, line) in f.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let op = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}:{}: {e}", path.display(), i + 1),
            )
        })?;
        ops.push(op);
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_is_one_json_line_and_reads_back() {
        let op = Op {
            t0: 1,
            t1: 2,
            process: "w0".into(),
            event: Event::Ingest {
                via: "lb".into(),
                run: None,
                key: "k1".into(),
                value: 7,
                player: "w0".into(),
                outcome: Outcome::Indeterminate,
                status: Some(503),
                payload: None,
                error: Some("log unavailable".into()),
            },
        };
        let line = serde_json::to_string(&op).unwrap();
        assert!(
            line.starts_with(r#"{"t0":1,"t1":2,"process":"w0","f":"ingest","via":"lb","#),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Op>(&line).unwrap(), op);
    }
}
