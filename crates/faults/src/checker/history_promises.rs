//! The promises checked from the history alone: counts, replicas-identical,
//! unique-version, monotonic, after-respected, mover-ends-at-final (each
//! described in the checker's module doc).
//!
//! What it is not: the promises that need the topic read at the end (those
//! are `log_promises`'), nor the reading of the history (`reading`).

use super::reading::{parse_payload, Checker, FinalRead, Seen};
use super::{Property, REPLAY_NODE};
use crate::history::{Event, Outcome, ReadMode};
use crate::partition;
use std::collections::{BTreeMap, BTreeSet, HashMap};

impl<'a> Checker<'a> {
    /// acknowledged ≤ applied ≤ acknowledged + indeterminate, per key and node.
    pub(super) fn counts(&mut self) {
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

    pub(super) fn replicas_identical(&mut self) {
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

    pub(super) fn unique_version(&mut self) {
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

    pub(super) fn monotonic(&mut self) {
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

    pub(super) fn after_respected(&mut self) {
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
    pub(super) fn final_of(&self, key: &str) -> Option<FinalRead<'a>> {
        self.finals
            .get(REPLAY_NODE)
            .and_then(|k| k.get(key))
            .or_else(|| self.finals.values().find_map(|k| k.get(key)))
            .copied()
    }

    pub(super) fn mover_ends_at_final(&mut self) {
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
}
