//! The promises checked against the topic read at the end:
//! acknowledged-in-log, refused-not-in-log, at-most-once,
//! wrong-partition-not-applied, observations-match-log,
//! wrong-partition-counted (each described in the checker's module doc).
//!
//! What it is not: the model of the topic (`topic`), nor the promises the
//! history alone shows (`history_promises`).

use super::reading::{parse_payload, Checker};
use super::topic::{Rec, Topic};
use super::{Property, REPLAY_NODE, WRONG_PARTITION_METRIC};
use crate::history::{Event, Op, Outcome};
use crate::partition;
use std::collections::BTreeSet;

/// A violation found, reported once every check ran: the property, the key,
/// what, the operations that show it.
type Found<'a> = (Property, Option<&'a str>, String, Vec<usize>);

impl<'a> Checker<'a> {
    pub(super) fn log_checks(&mut self) {
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

    /// Acknowledged, refused, at most once: each ingest against the log.
    /// Returns the values lost (acknowledged, not in the key's home
    /// partition) and the copies beyond the first.
    pub(super) fn ingests_in_log(
        &self,
        topic: &Topic<'_, 'a>,
        found: &mut Vec<Found<'a>>,
    ) -> (u64, u64) {
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
    pub(super) fn wrong_partition_not_applied(
        &self,
        topic: &Topic<'_, 'a>,
        found: &mut Vec<Found<'a>>,
    ) {
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
    pub(super) fn observations_match_log(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) {
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
    pub(super) fn nodes_end_at_log_end(&self, topic: &Topic<'_, 'a>, found: &mut Vec<Found<'a>>) {
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
    pub(super) fn wrong_partition_counted(&self, found: &mut Vec<Found<'a>>) {
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
