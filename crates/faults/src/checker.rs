//! The checker: what must hold of a history, whatever the nemesis did
//! (the promises of docs/operations.md#the-kafka-log, one [`Property`] each), and the figures of a run.
//!
//! From the history alone:
//! - **counts**: per key and per node, acknowledged ≤ applied ≤
//!   acknowledged + indeterminate, where applied is the final payload's `n`
//!   (the default config's `count` field) and a foreign record counts only
//!   when it landed in the key's home partition; the same bounds for `sum`;
//! - **replicas-identical**: every node, the one replaying from nothing
//!   included, holds the same bytes for every key once faults stop;
//! - **unique-version**: a (key, version) names one payload, ever, across
//!   every observation on every node;
//! - **monotonic**: versions never go backwards within a session (a
//!   connection, or a moving client's life), nor, in real time, within one
//!   run of a node (a read begun after another ended sees at least its
//!   version; an acknowledged ingest's answer counts as a read);
//! - **after-respected**: a long-poll or stream answer is newer than the
//!   `after` / `Last-Event-ID` it carried;
//! - **mover-ends-at-final**: a client moving between nodes ends at the final
//!   state of its key.
//!
//! With the topic read from its start at the end (`record` operations; the
//! `topic` operation gives the partition count, hence each key's home):
//! - **acknowledged-in-log**: every acknowledged message is in the log, in
//!   its key's home partition, and its answer includes it (`lost` counts
//!   those that are not);
//! - **refused-not-in-log**: a refused message never reaches the log;
//! - **at-most-once**: no message is in the log twice (no client retries);
//! - **wrong-partition-not-applied**: a record outside its key's home
//!   partition (the foreign producer's) shows in no payload;
//! - **observations-match-log**: every payload anyone saw is the projection
//!   of the key's home-partition records up to its version (`ver` = offset +
//!   1), and every node's final payload is that of the last one;
//! - **wrong-partition-counted**: the node that replayed from nothing
//!   counted every record outside its home partition, once.
//!
//! What it is not: a linearizability checker. The boxes are replicas built
//! from a log, so the log itself is the order; what is checked is that every
//! node agrees with it.

use crate::history::{Event, Op, Outcome, ReadMode};
use crate::partition;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// The node that starts from nothing once faults stopped and replays the
/// whole topic.
pub const REPLAY_NODE: &str = "c";

/// The metric the replaying node must count wrong-partition records in.
pub const WRONG_PARTITION_METRIC: &str = r#"pollbox_log_records_total{result="wrong_partition"}"#;

/// A promise of the Kafka log (docs/operations.md#the-kafka-log) the checker tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    Counts,
    ReplicasIdentical,
    UniqueVersion,
    Monotonic,
    AfterRespected,
    MoverEndsAtFinal,
    AcknowledgedInLog,
    RefusedNotInLog,
    AtMostOnce,
    WrongPartitionNotApplied,
    ObservationsMatchLog,
    WrongPartitionCounted,
}

impl Property {
    pub const ALL: [Property; 12] = [
        Property::Counts,
        Property::ReplicasIdentical,
        Property::UniqueVersion,
        Property::Monotonic,
        Property::AfterRespected,
        Property::MoverEndsAtFinal,
        Property::AcknowledgedInLog,
        Property::RefusedNotInLog,
        Property::AtMostOnce,
        Property::WrongPartitionNotApplied,
        Property::ObservationsMatchLog,
        Property::WrongPartitionCounted,
    ];

    /// The property named `name` (as [`Property::name`] writes it).
    pub fn from_name(name: &str) -> Option<Property> {
        Property::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Property::Counts => "counts",
            Property::ReplicasIdentical => "replicas-identical",
            Property::UniqueVersion => "unique-version",
            Property::Monotonic => "monotonic",
            Property::AfterRespected => "after-respected",
            Property::MoverEndsAtFinal => "mover-ends-at-final",
            Property::AcknowledgedInLog => "acknowledged-in-log",
            Property::RefusedNotInLog => "refused-not-in-log",
            Property::AtMostOnce => "at-most-once",
            Property::WrongPartitionNotApplied => "wrong-partition-not-applied",
            Property::ObservationsMatchLog => "observations-match-log",
            Property::WrongPartitionCounted => "wrong-partition-counted",
        }
    }
}

/// One broken promise, with the operations (indexes into the history) that
/// show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub property: Property,
    pub key: Option<String>,
    pub what: String,
    pub ops: Vec<usize>,
}

/// What a run did, in numbers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub ingests: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub indeterminate: u64,
    pub foreign: u64,
    pub foreign_acknowledged: u64,
    pub foreign_wrong_partition: u64,
    pub reads: u64,
    pub stream_events: u64,
    pub long_polls: u64,
    pub faults: BTreeMap<String, u64>,
    pub log_records: u64,
    pub log_wrong_partition: u64,
    /// Acknowledged messages the log does not hold (or, without the log,
    /// that the final `n` does not count).
    pub lost: u64,
    pub duplicated: u64,
    pub keys: u64,
    pub nodes_final: Vec<String>,
}

/// The checker's verdict.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub figures: Figures,
    pub violations: Vec<Violation>,
    /// Which properties were checked (the log's need the topic's read).
    pub checked: Vec<Property>,
}

impl Report {
    pub fn valid(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn broken(&self) -> BTreeSet<Property> {
        self.violations.iter().map(|v| v.property).collect()
    }

    /// Whether every property outside `allowed` held (what the exit status
    /// says when some are allowed to fail, e.g. a known, open bug).
    pub fn valid_except(&self, allowed: &BTreeSet<Property>) -> bool {
        self.violations
            .iter()
            .all(|v| allowed.contains(&v.property))
    }
}

/// The fields of a payload of the default config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    k: String,
    ver: u64,
    #[serde(default)]
    v: Option<i64>,
    #[serde(default)]
    sum: Option<i64>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    by: Option<String>,
}

fn parse_payload(s: &str) -> Option<Payload> {
    serde_json::from_str(s).ok()
}

/// A message's body as the workload and the foreign producer write it.
#[derive(Debug, Deserialize)]
struct Message {
    value: i64,
    player: String,
}

/// A read, or an acknowledged ingest's answer: something a node showed.
struct Seen<'a> {
    i: usize,
    t0: u64,
    t1: u64,
    via: &'a str,
    run: Option<u32>,
    session: Option<(&'a str, u64)>,
    mover: bool,
    mode: Option<ReadMode>,
    key: &'a str,
    after: Option<u64>,
    ver: u64,
    payload: Option<&'a str>,
}

/// Check a history.
pub fn check(ops: &[Op]) -> Report {
    let mut c = Checker::new(ops);
    c.figures();
    c.counts();
    c.replicas_identical();
    c.unique_version();
    c.monotonic();
    c.after_respected();
    c.mover_ends_at_final();
    let has_log = ops.iter().any(|o| matches!(o.event, Event::Record { .. }));
    if has_log {
        c.log_checks();
    }
    let mut checked: Vec<Property> = Property::ALL[..6].to_vec();
    if has_log {
        checked.extend_from_slice(&Property::ALL[6..]);
    }
    c.report.checked = checked;
    c.report
}

/// A node's final read of a key: (version, payload, op index).
type FinalRead<'a> = (u64, Option<&'a str>, usize);

struct Checker<'a> {
    ops: &'a [Op],
    seen: Vec<Seen<'a>>,
    partitions: Option<i32>,
    /// Final reads: node -> key -> (ver, payload, op index).
    finals: BTreeMap<&'a str, BTreeMap<&'a str, FinalRead<'a>>>,
    report: Report,
}

impl<'a> Checker<'a> {
    fn new(ops: &'a [Op]) -> Checker<'a> {
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

    fn violate(&mut self, property: Property, key: Option<&str>, what: String, ops: Vec<usize>) {
        self.report.violations.push(Violation {
            property,
            key: key.map(str::to_string),
            what,
            ops,
        });
    }

    fn figures(&mut self) {
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

    /// acknowledged ≤ applied ≤ acknowledged + indeterminate, per key and node.
    fn counts(&mut self) {
        #[derive(Default)]
        struct Bounds {
            acked: u64,
            indet: u64,
            acked_sum: i64,
            indet_sum: i64,
        }
        let mut by_key: BTreeMap<&str, Bounds> = BTreeMap::new();
        for op in self.ops {
            let (key, value, outcome, counts) = match &op.event {
                Event::Ingest {
                    key,
                    value,
                    outcome,
                    ..
                } => (key, *value, *outcome, true),
                Event::Foreign {
                    key,
                    value,
                    outcome,
                    partition,
                    ..
                } => {
                    // An acknowledged foreign record outside the key's home
                    // partition must never be applied: it bounds nothing.
                    let home = match (partition, self.partitions) {
                        (Some(p), Some(n)) => *p == partition::home(key, n),
                        _ => true,
                    };
                    (key, *value, *outcome, *outcome != Outcome::Ok || home)
                }
                _ => continue,
            };
            if !counts {
                continue;
            }
            let b = by_key.entry(key.as_str()).or_default();
            match outcome {
                Outcome::Ok => {
                    b.acked += 1;
                    b.acked_sum += value;
                }
                Outcome::Indeterminate => {
                    b.indet += 1;
                    b.indet_sum += value;
                }
                Outcome::Refused => {}
            }
        }
        let mut lost = 0;
        let mut found = Vec::new();
        for (node, keys) in &self.finals {
            for (key, b) in &by_key {
                let (n, sum, i) = match keys.get(key) {
                    Some((_, Some(p), i)) => match parse_payload(p) {
                        Some(p) => (p.n.unwrap_or(0), p.sum.unwrap_or(0), Some(*i)),
                        None => continue, // observations-match-log says why
                    },
                    Some((_, None, i)) => (0, 0, Some(*i)),
                    None => (0, 0, None),
                };
                if n < b.acked {
                    lost = lost.max(b.acked - n);
                }
                if n < b.acked || n > b.acked + b.indet {
                    found.push((
                        *key,
                        format!(
                            "node {node}: n = {n}, but {} acknowledged and {} indeterminate",
                            b.acked, b.indet
                        ),
                        i,
                    ));
                } else if sum < b.acked_sum || sum > b.acked_sum + b.indet_sum {
                    found.push((
                        *key,
                        format!(
                            "node {node}: sum = {sum}, outside [{}, {}] (acknowledged, + indeterminate)",
                            b.acked_sum,
                            b.acked_sum + b.indet_sum
                        ),
                        i,
                    ));
                }
            }
        }
        self.report.figures.lost = lost;
        for (key, what, i) in found {
            self.violate(Property::Counts, Some(key), what, i.into_iter().collect());
        }
    }

    fn replicas_identical(&mut self) {
        let mut keys: BTreeSet<&str> = BTreeSet::new();
        for k in self.finals.values() {
            keys.extend(k.keys().copied());
        }
        let mut found = Vec::new();
        for key in keys {
            let mut first: Option<(&str, Option<&str>, usize)> = None;
            for (node, k) in &self.finals {
                let Some((_, payload, i)) = k.get(key) else {
                    found.push((key, format!("node {node} was not read"), vec![]));
                    continue;
                };
                match first {
                    None => first = Some((node, *payload, *i)),
                    Some((n0, p0, i0)) if p0 != *payload => found.push((
                        key,
                        format!(
                            "node {n0} holds {} but node {node} holds {}",
                            p0.unwrap_or("no box"),
                            payload.unwrap_or("no box")
                        ),
                        vec![i0, *i],
                    )),
                    Some(_) => {}
                }
            }
        }
        for (key, what, ops) in found {
            self.violate(Property::ReplicasIdentical, Some(key), what, ops);
        }
    }

    fn unique_version(&mut self) {
        let mut by: HashMap<(&str, u64), (&str, usize)> = HashMap::new();
        let mut found = Vec::new();
        for s in &self.seen {
            let Some(p) = s.payload else { continue };
            if s.ver == 0 {
                continue;
            }
            match by.get(&(s.key, s.ver)) {
                None => {
                    by.insert((s.key, s.ver), (p, s.i));
                }
                Some((p0, i0)) if *p0 != p => {
                    found.push((
                        s.key,
                        format!("version {}: {p0} and {p} (node {})", s.ver, s.via),
                        vec![*i0, s.i],
                    ));
                }
                Some(_) => {}
            }
        }
        for (key, what, ops) in found {
            self.violate(Property::UniqueVersion, Some(key), what, ops);
        }
    }

    fn monotonic(&mut self) {
        let mut found = Vec::new();
        // Within a session, in the order its reads were made.
        let mut sessions: BTreeMap<(&str, u64), Vec<&Seen>> = BTreeMap::new();
        for s in &self.seen {
            if let Some(id) = s.session {
                if s.mode != Some(ReadMode::Final) {
                    sessions.entry(id).or_default().push(s);
                }
            }
        }
        for ((process, id), mut reads) in sessions {
            reads.sort_by_key(|s| (s.t1, s.i));
            let mut last: HashMap<&str, &Seen> = HashMap::new();
            for s in reads {
                if let Some(prev) = last.get(s.key) {
                    if s.ver < prev.ver {
                        found.push((
                            s.key,
                            format!(
                                "session {process}/{id}: version {} after {} (node {} after node {})",
                                s.ver, prev.ver, s.via, prev.via
                            ),
                            vec![prev.i, s.i],
                        ));
                    }
                }
                last.insert(s.key, s);
            }
        }
        // Within one run of a node, in real time: a read begun after another
        // ended sees at least its version.
        let mut runs: BTreeMap<(&str, u32, &str), Vec<&Seen>> = BTreeMap::new();
        for s in &self.seen {
            if let Some(run) = s.run {
                runs.entry((s.via, run, s.key)).or_default().push(s);
            }
        }
        for ((node, run, key), reads) in runs {
            let mut by_end: Vec<&Seen> = reads.clone();
            by_end.sort_by_key(|s| s.t1);
            let mut by_start = reads;
            by_start.sort_by_key(|s| s.t0);
            let mut done = 0;
            let mut max: Option<&Seen> = None;
            for s in by_start {
                while done < by_end.len() && by_end[done].t1 < s.t0 {
                    let e = by_end[done];
                    if max.is_none_or(|m| e.ver > m.ver) {
                        max = Some(e);
                    }
                    done += 1;
                }
                if let Some(m) = max {
                    if s.ver < m.ver {
                        found.push((
                            key,
                            format!(
                                "node {node} run {run}: a read begun at {} µs saw version {}, after one that ended at {} µs saw {}",
                                s.t0, s.ver, m.t1, m.ver
                            ),
                            vec![m.i, s.i],
                        ));
                    }
                }
            }
        }
        found.sort_by_key(|f| f.2.clone());
        found.dedup_by(|a, b| a.2 == b.2);
        for (key, what, ops) in found {
            self.violate(Property::Monotonic, Some(key), what, ops);
        }
    }

    fn after_respected(&mut self) {
        let mut found = Vec::new();
        for s in &self.seen {
            if let (Some(after), Some(ReadMode::LongPoll | ReadMode::Stream)) = (s.after, s.mode) {
                if s.ver != 0 && s.ver <= after {
                    found.push((
                        s.key,
                        format!(
                            "node {}: version {} answered to after = {after}",
                            s.via, s.ver
                        ),
                        vec![s.i],
                    ));
                }
            }
        }
        for (key, what, ops) in found {
            self.violate(Property::AfterRespected, Some(key), what, ops);
        }
    }

    /// The final state of a key: the replaying node's, else any node's.
    fn final_of(&self, key: &str) -> Option<FinalRead<'a>> {
        self.finals
            .get(REPLAY_NODE)
            .and_then(|k| k.get(key))
            .or_else(|| self.finals.values().find_map(|k| k.get(key)))
            .copied()
    }

    fn mover_ends_at_final(&mut self) {
        let mut movers: BTreeMap<(&str, u64), (&str, Option<&Seen>)> = BTreeMap::new();
        for s in &self.seen {
            if s.mover {
                let e = movers
                    .entry(s.session.unwrap_or(("", 0)))
                    .or_insert((s.key, None));
                if e.1.is_none_or(|l| (s.t1, s.i) > (l.t1, l.i)) {
                    e.1 = Some(s);
                }
            }
        }
        let mut found = Vec::new();
        for ((process, id), (key, last)) in movers {
            let Some((fver, fpayload, fi)) = self.final_of(key) else {
                continue;
            };
            let (lver, lpayload, li) =
                last.map_or((0, None, None), |l| (l.ver, l.payload, Some(l.i)));
            if (lver, lpayload) != (fver, fpayload) {
                found.push((
                    key,
                    format!(
                        "{process}/{id} ended at version {lver}, the final state is version {fver}"
                    ),
                    li.into_iter().chain([fi]).collect(),
                ));
            }
        }
        for (key, what, ops) in found {
            self.violate(Property::MoverEndsAtFinal, Some(key), what, ops);
        }
    }

    fn log_checks(&mut self) {
        let partitions = self.partitions.unwrap_or(1);
        let recs = self.records();
        self.report.figures.log_wrong_partition = recs
            .iter()
            .filter(|r| r.key.is_some() && !r.is_home(partitions))
            .count() as u64;
        let topic = Topic::new(&recs, partitions);
        let mut found: Vec<Found<'a>> = Vec::new();
        let (lost, duplicated) = self.ingests_in_log(&topic, &mut found);
        self.report.figures.duplicated += duplicated;
        self.report.figures.lost = self.report.figures.lost.max(lost);
        self.wrong_partition_not_applied(&topic, &mut found);
        self.observations_match_log(&topic, &mut found);
        self.nodes_end_at_log_end(&topic, &mut found);
        self.wrong_partition_counted(&mut found);
        for (property, key, what, ops) in found {
            self.violate(property, key, what, ops);
        }
    }

    /// The topic as read at the end.
    fn records(&self) -> Vec<Rec<'a>> {
        let ops: &'a [Op] = self.ops;
        let mut recs = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Event::Record {
                partition,
                offset,
                key,
                value,
            } = &op.event
            {
                recs.push(Rec {
                    i,
                    partition: *partition,
                    offset: *offset,
                    key: key.as_deref(),
                    msg: value.as_deref().and_then(|v| serde_json::from_str(v).ok()),
                    tombstone: value.is_none(),
                });
            }
        }
        recs
    }

    /// Acknowledged, refused, at most once: each ingest against the log.
    /// Returns the values lost (acknowledged, not in the key's home
    /// partition) and the copies beyond the first.
    fn ingests_in_log(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) -> (u64, u64) {
        let ops: &'a [Op] = self.ops;
        let partitions = topic.partitions;
        let (mut lost, mut duplicated) = (0, 0);
        for (i, op) in ops.iter().enumerate() {
            match &op.event {
                Event::Ingest {
                    key,
                    value,
                    outcome,
                    payload,
                    via,
                    ..
                } => {
                    let at = topic.places.get(value).map(Vec::as_slice).unwrap_or(&[]);
                    let in_home: Vec<&&Rec> = at
                        .iter()
                        .filter(|(k, h, _)| *h && *k == Some(key.as_str()))
                        .map(|(_, _, r)| r)
                        .collect();
                    match outcome {
                        Outcome::Ok => {
                            if in_home.is_empty() {
                                lost += 1;
                                found.push((
                                    Property::AcknowledgedInLog,
                                    Some(key),
                                    format!(
                                        "value {value} acknowledged by {via} is not in partition {} of the log",
                                        partition::home(key, partitions)
                                    ),
                                    vec![i],
                                ));
                            } else if let Some(p) = payload.as_deref().and_then(parse_payload) {
                                let r = in_home[0];
                                let ver = (r.offset + 1) as u64;
                                if p.ver < ver || (p.ver == ver && p.v != Some(*value)) {
                                    found.push((
                                        Property::AcknowledgedInLog,
                                        Some(key),
                                        format!(
                                            "value {value} is at offset {} (version {ver}), but {via} answered version {} without it",
                                            r.offset, p.ver
                                        ),
                                        vec![i, r.i],
                                    ));
                                }
                            }
                        }
                        Outcome::Refused => {
                            if let Some((_, _, r)) = at.first() {
                                found.push((
                                    Property::RefusedNotInLog,
                                    Some(key),
                                    format!(
                                        "value {value} was refused by {via}, but is at {}/{}",
                                        r.partition, r.offset
                                    ),
                                    vec![i, r.i],
                                ));
                            }
                        }
                        Outcome::Indeterminate => {}
                    }
                    if at.len() > 1 {
                        duplicated += at.len() as u64 - 1;
                        found.push((
                            Property::AtMostOnce,
                            Some(key),
                            format!("value {value} is in the log {} times", at.len()),
                            std::iter::once(i)
                                .chain(at.iter().map(|(_, _, r)| r.i))
                                .collect(),
                        ));
                    }
                }
                Event::Foreign {
                    key,
                    value,
                    outcome: Outcome::Ok,
                    partition: Some(p),
                    offset: Some(o),
                    ..
                } => {
                    let at = topic.places.get(value).map(Vec::as_slice).unwrap_or(&[]);
                    if !at
                        .iter()
                        .any(|(_, _, r)| r.partition == *p && r.offset == *o)
                    {
                        if *p == partition::home(key, partitions) {
                            lost += 1;
                        }
                        found.push((
                            Property::AcknowledgedInLog,
                            Some(key),
                            format!("foreign value {value} acknowledged at {p}/{o} is not there"),
                            vec![i],
                        ));
                    }
                }
                _ => {}
            }
        }
        (lost, duplicated)
    }

    /// Wrong-partition records show in no payload: the value they carry
    /// lives nowhere else, so a payload whose last value is theirs applied
    /// them.
    fn wrong_partition_not_applied(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) {
        let partitions = topic.partitions;
        for s in &self.seen {
            let Some(p) = s.payload.and_then(parse_payload) else {
                continue;
            };
            let Some(v) = p.v else { continue };
            if let Some(at) = topic.places.get(&v) {
                if at.iter().all(|(_, h, _)| !h) {
                    let r = at[0].2;
                    found.push((
                        Property::WrongPartitionNotApplied,
                        Some(s.key),
                        format!(
                            "node {} shows value {v}, which is only at {}/{} (home partition {})",
                            s.via,
                            r.partition,
                            r.offset,
                            partition::home(s.key, partitions)
                        ),
                        vec![r.i, s.i],
                    ));
                }
            }
        }
    }

    /// Every payload seen is the log's projection at its version.
    fn observations_match_log(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) {
        for s in &self.seen {
            let Some(raw) = s.payload else { continue };
            let states = topic.model.get(s.key);
            let want = states.and_then(|m| m.get(&s.ver));
            let got = parse_payload(raw);
            let ok = match (want, &got) {
                (Some(Some(w)), Some(g)) => w == g,
                _ => false,
            };
            if !ok {
                found.push((
                    Property::ObservationsMatchLog,
                    Some(s.key),
                    match want {
                        Some(Some(w)) => format!(
                            "node {} showed {raw}; the log at version {} gives {w:?}",
                            s.via, s.ver
                        ),
                        _ => format!(
                            "node {} showed {raw}; no record of the key's home partition is at version {}",
                            s.via, s.ver
                        ),
                    },
                    vec![s.i],
                ));
            }
        }
    }

    /// Every node ends at the log's end.
    fn nodes_end_at_log_end(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) {
        for (node, keys) in &self.finals {
            let all: BTreeSet<&str> = keys
                .keys()
                .copied()
                .chain(topic.model.keys().copied())
                .collect();
            for key in all {
                let last = topic
                    .model
                    .get(key)
                    .and_then(|m| m.last_key_value())
                    .and_then(|(_, p)| p.as_ref());
                let got = keys.get(key);
                let ok = match (last, got) {
                    (None, Some((0, None, _))) => true,
                    (Some(w), Some((ver, Some(_), _))) => w.ver == *ver,
                    _ => false,
                };
                if !ok {
                    found.push((
                        Property::ObservationsMatchLog,
                        Some(key),
                        format!(
                            "node {node} ends at version {}, the log's last record of the key gives version {}",
                            got.map_or("unread".to_string(), |g| g.0.to_string()),
                            last.map_or(0, |w| w.ver)
                        ),
                        got.map(|g| g.2).into_iter().collect(),
                    ));
                }
            }
        }
    }

    /// The node replaying from nothing counted each wrong-partition record once.
    fn wrong_partition_counted(&self, found: &mut Vec<Found<'a>>) {
        if !self.finals.contains_key(REPLAY_NODE) {
            return;
        }
        let counted = self
            .ops
            .iter()
            .enumerate()
            .find_map(|(i, op)| match &op.event {
                Event::Metric { via, name, value }
                    if via == REPLAY_NODE && name == WRONG_PARTITION_METRIC =>
                {
                    Some((i, *value))
                }
                _ => None,
            });
        let want = self.report.figures.log_wrong_partition;
        match counted {
            Some((_, v)) if v as u64 == want => {}
            None if want == 0 => {}
            other => found.push((
                Property::WrongPartitionCounted,
                None,
                format!(
                    "node {REPLAY_NODE} counted {} wrong-partition records; the log holds {want}",
                    other.map_or("none (no metric)".to_string(), |(_, v)| v.to_string())
                ),
                other.map(|(i, _)| i).into_iter().collect(),
            )),
        }
    }
}

/// A violation found, reported once every check ran: the property, the key,
/// what, the operations that show it.
type Found<'a> = (Property, Option<&'a str>, String, Vec<usize>);

/// A record of the topic as read at the end.
struct Rec<'a> {
    i: usize,
    partition: i32,
    offset: i64,
    key: Option<&'a str>,
    msg: Option<Message>,
    tombstone: bool,
}

impl Rec<'_> {
    /// Whether the record is in its key's home partition (one without a key
    /// is in none).
    fn is_home(&self, partitions: i32) -> bool {
        self.key
            .is_some_and(|k| partition::home(k, partitions) == self.partition)
    }
}

/// Where a value is: (key, in its home partition?, the record).
type Place<'r, 'a> = (Option<&'a str>, bool, &'r Rec<'a>);

/// What the checks read of the topic.
struct Topic<'r, 'a> {
    partitions: i32,
    /// The model: per key, its state after each home-partition record, by
    /// version.
    model: HashMap<&'a str, BTreeMap<u64, Option<Payload>>>,
    /// Where each value is.
    places: HashMap<i64, Vec<Place<'r, 'a>>>,
}

impl<'r, 'a> Topic<'r, 'a> {
    fn new(recs: &'r [Rec<'a>], partitions: i32) -> Topic<'r, 'a> {
        let mut home_recs: BTreeMap<&str, Vec<&Rec>> = BTreeMap::new();
        for r in recs {
            if let (Some(k), true) = (r.key, r.is_home(partitions)) {
                home_recs.entry(k).or_default().push(r);
            }
        }
        let mut model: HashMap<&str, BTreeMap<u64, Option<Payload>>> = HashMap::new();
        for (key, rs) in &mut home_recs {
            rs.sort_by_key(|r| r.offset);
            let mut states = BTreeMap::new();
            let mut cur: Option<Payload> = None;
            for r in rs.iter() {
                let ver = (r.offset + 1) as u64;
                if r.tombstone {
                    cur = None;
                } else if let Some(m) = &r.msg {
                    let p = cur.get_or_insert(Payload {
                        k: key.to_string(),
                        ver,
                        v: None,
                        sum: Some(0),
                        n: Some(0),
                        by: None,
                    });
                    p.ver = ver;
                    p.v = Some(m.value);
                    p.sum = Some(p.sum.unwrap_or(0) + m.value);
                    p.n = Some(p.n.unwrap_or(0) + 1);
                    p.by = Some(m.player.clone());
                } else {
                    continue; // an invalid record: applied by no node
                }
                states.insert(ver, cur.clone());
            }
            model.insert(key, states);
        }
        let mut places: HashMap<i64, Vec<Place>> = HashMap::new();
        for r in recs {
            if let Some(m) = &r.msg {
                places
                    .entry(m.value)
                    .or_default()
                    .push((r.key, r.is_home(partitions), r));
            }
        }
        Topic {
            partitions,
            model,
            places,
        }
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            f,
            "faults injected: {} ({})",
            self.faults.values().sum::<u64>(),
            faults.join(", ")
        )?;
        writeln!(
            f,
            "ingests: {} ({} acknowledged, {} refused, {} indeterminate) over {} keys",
            self.ingests, self.acknowledged, self.refused, self.indeterminate, self.keys
        )?;
        writeln!(
            f,
            "foreign records: {} ({} acknowledged, {} of them outside their home partition)",
            self.foreign, self.foreign_acknowledged, self.foreign_wrong_partition
        )?;
        writeln!(
            f,
            "reads: {} ({} long-polls, {} stream events); final reads on nodes {}",
            self.reads,
            self.long_polls,
            self.stream_events,
            self.nodes_final.join(", ")
        )?;
        writeln!(
            f,
            "log: {} records ({} outside their home partition)",
            self.log_records, self.log_wrong_partition
        )?;
        write!(f, "lost: {}, duplicated: {}", self.lost, self.duplicated)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.figures)?;
        let broken = self.broken();
        for p in &self.checked {
            let n = self.violations.iter().filter(|v| v.property == *p).count();
            if broken.contains(p) {
                writeln!(f, "  {:<28} FAIL ({n})", p.name())?;
            } else {
                writeln!(f, "  {:<28} ok", p.name())?;
            }
        }
        for v in self.violations.iter().take(50) {
            writeln!(
                f,
                "  {}: {}{} (history ops {:?})",
                v.property.name(),
                v.key
                    .as_deref()
                    .map(|k| format!("{k}: "))
                    .unwrap_or_default(),
                v.what,
                v.ops
            )?;
        }
        if self.violations.len() > 50 {
            writeln!(f, "  ... {} more", self.violations.len() - 50)?;
        }
        write!(f, "{}", if self.valid() { "VALID" } else { "INVALID" })
    }
}

#[cfg(test)]
mod tests;
