//! The history as the checks read it: what each node showed ([`Seen`]: a
//! read, or an acknowledged ingest's answer), the final reads by node and
//! key, the topic's partition count, and the run's figures counted from
//! the operations.
//!
//! What it is not: a check. Nothing here decides that a promise broke; it
//! gathers what the checks in `history_promises` and `log_promises` compare.

use super::{Property, Report, Violation};
use crate::history::{Event, Op, Outcome, ReadMode};
use crate::partition;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The fields of a payload of the default config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Payload {
    pub(super) k: String,
    pub(super) ver: u64,
    #[serde(default)]
    pub(super) v: Option<i64>,
    #[serde(default)]
    pub(super) sum: Option<i64>,
    #[serde(default)]
    pub(super) n: Option<u64>,
    #[serde(default)]
    pub(super) by: Option<String>,
}

pub(super) fn parse_payload(s: &str) -> Option<Payload> {
    serde_json::from_str(s).ok()
}

/// A message's body as the workload and the foreign producer write it.
#[derive(Debug, Deserialize)]
pub(super) struct Message {
    pub(super) value: i64,
    pub(super) player: String,
}

/// A read, or an acknowledged ingest's answer: something a node showed.
pub(super) struct Seen<'a> {
    pub(super) i: usize,
    pub(super) t0: u64,
    pub(super) t1: u64,
    pub(super) via: &'a str,
    pub(super) run: Option<u32>,
    pub(super) session: Option<(&'a str, u64)>,
    pub(super) mover: bool,
    pub(super) mode: Option<ReadMode>,
    pub(super) key: &'a str,
    pub(super) after: Option<u64>,
    pub(super) ver: u64,
    pub(super) payload: Option<&'a str>,
}

/// A node's final read of a key: (version, payload, op index).
pub(super) type FinalRead<'a> = (u64, Option<&'a str>, usize);

pub(super) struct Checker<'a> {
    pub(super) ops: &'a [Op],
    pub(super) seen: Vec<Seen<'a>>,
    pub(super) partitions: Option<i32>,
    /// Final reads: node -> key -> (ver, payload, op index).
    pub(super) finals: BTreeMap<&'a str, BTreeMap<&'a str, FinalRead<'a>>>,
    pub(super) report: Report,
}

impl<'a> Checker<'a> {
    pub(super) fn new(ops: &'a [Op]) -> Checker<'a> {
        let mut seen = Vec::new();
        let mut partitions = None;
        let mut finals: BTreeMap<&str, BTreeMap<&str, FinalRead>> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            match &op.event {
                Event::Topic { partitions: p } => partitions = Some(*p),
                Event::Read {
                    via,
                    run,
                    session,
                    mover,
                    mode,
                    key,
                    after,
                    ver,
                    payload,
                } => {
                    if *mode == ReadMode::Final {
                        finals
                            .entry(via.as_str())
                            .or_default()
                            .insert(key.as_str(), (*ver, payload.as_deref(), i));
                    }
                    seen.push(Seen {
                        i,
                        t0: op.t0,
                        t1: op.t1,
                        via,
                        run: *run,
                        session: Some((op.process.as_str(), *session)),
                        mover: *mover,
                        mode: Some(*mode),
                        key,
                        after: *after,
                        ver: *ver,
                        payload: payload.as_deref(),
                    });
                }
                Event::Ingest {
                    via,
                    run,
                    key,
                    outcome: Outcome::Ok,
                    payload: Some(p),
                    ..
                } => {
                    let ver = parse_payload(p).map_or(0, |b| b.ver);
                    seen.push(Seen {
                        i,
                        t0: op.t0,
                        t1: op.t1,
                        via,
                        run: *run,
                        session: None,
                        mover: false,
                        mode: None,
                        key,
                        after: None,
                        ver,
                        payload: Some(p),
                    });
                }
                _ => {}
            }
        }
        Checker {
            ops,
            seen,
            partitions,
            finals,
            report: Report::default(),
        }
    }

    pub(super) fn violate(
        &mut self,
        property: Property,
        key: Option<&str>,
        what: String,
        ops: Vec<usize>,
    ) {
        self.report.violations.push(Violation {
            property,
            key: key.map(str::to_string),
            what,
            ops,
        });
    }

    pub(super) fn figures(&mut self) {
        let f = &mut self.report.figures;
        let mut keys = BTreeSet::new();
        for op in self.ops {
            match &op.event {
                Event::Ingest { key, outcome, .. } => {
                    keys.insert(key.as_str());
                    f.ingests += 1;
                    match outcome {
                        Outcome::Ok => f.acknowledged += 1,
                        Outcome::Refused => f.refused += 1,
                        Outcome::Indeterminate => f.indeterminate += 1,
                    }
                }
                Event::Foreign {
                    key,
                    outcome,
                    partition,
                    ..
                } => {
                    keys.insert(key.as_str());
                    f.foreign += 1;
                    if *outcome == Outcome::Ok {
                        f.foreign_acknowledged += 1;
                        if let (Some(p), Some(n)) = (partition, self.partitions) {
                            if *p != partition::home(key, n) {
                                f.foreign_wrong_partition += 1;
                            }
                        }
                    }
                }
                Event::Read { mode, .. } => {
                    f.reads += 1;
                    match mode {
                        ReadMode::Stream => f.stream_events += 1,
                        ReadMode::LongPoll => f.long_polls += 1,
                        _ => {}
                    }
                }
                Event::Fault {
                    fault,
                    phase: crate::history::Phase::Start,
                    ..
                } => *f.faults.entry(fault.clone()).or_default() += 1,
                Event::Record { .. } => f.log_records += 1,
                _ => {}
            }
        }
        f.keys = keys.len() as u64;
        f.nodes_final = self.finals.keys().map(|s| s.to_string()).collect();
    }
}
