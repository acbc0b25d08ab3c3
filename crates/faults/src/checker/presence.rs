//! The presence promises (docs/presence.md#on-a-log-cluster), from the
//! `presence-*` operations of the history:
//!
//! - **presence-agreement**: in each final round, every node read serves
//!   the same version and the same members for each room (a 200, `count`
//!   the length of `members`);
//! - **presence-members**: each final read lists exactly the members whose
//!   streams are open: one open (on a node up) since at least
//!   [`JOIN_MS`] before the read is listed; one with no stream open since
//!   [`QUIET_MS`] (leave grace + lease + margin) before the read is not; a
//!   member with an open or close between is not judged (counted);
//! - **presence-dead-expired**: during the run, a read on a node that was
//!   not faulted, while the brokers were not faulted, never lists a member
//!   whose every stream either ended more than [`QUIET_MS`] before the read
//!   or is held by a node killed, paused or cut off from the brokers since
//!   more than lease + [`MARGIN_MS`] before the read and until after it.
//!
//! A stream's end is taken as the later of its close and, when its node
//! was faulted around it, the fault's end plus a heartbeat (a paused node
//! sees the connection gone only once it runs). A stream sent to a paused
//! node and not answered counts as open from its sending until then.
//!
//! What it is not: a check of joins and leaves as events (streams'
//! contents), nor of info (the workload sends none).

use super::reading::Checker;
use super::Property;
use crate::history::{Event, Phase};
use crate::presence::{LEASE_MS, LEAVE_GRACE_MS};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// Slack on top of the lease and the grace, in µs of the history.
pub const MARGIN_MS: u64 = 2_000;
/// A member whose streams all ended this long before a read is gone.
pub const QUIET_MS: u64 = LEAVE_GRACE_MS + LEASE_MS + MARGIN_MS;
/// A stream open this long before a read is listed by it.
pub const JOIN_MS: u64 = 2_000;
/// A faulted node notices a client's closed connection within a heartbeat
/// of running again (`http.sse_heartbeat_ms`).
const HEARTBEAT_MS: u64 = 1_000;
/// How long the brokers must have been left alone before a read's
/// dead-member check: Kafka's session timeout (a leader's loss is noticed).
const BROKERS_SETTLE_MS: u64 = 6_000;

const MS: u64 = 1_000;

#[derive(Debug, Deserialize)]
struct Served {
    k: String,
    ver: u64,
    count: u64,
    #[serde(default)]
    members: Option<Vec<Listed>>,
}

#[derive(Debug, Deserialize)]
struct Listed {
    id: String,
}

/// A member's stream on a node: from its sending to its (effective) end.
#[derive(Debug, Clone)]
struct Stream<'a> {
    member: &'a str,
    room: &'a str,
    via: &'a str,
    /// When it was sent, and when it was answered (`None`: never answered).
    t0: u64,
    answered: Option<u64>,
    /// When the client saw it end (`None`: open at the end of the history).
    closed: Option<u64>,
    ops: Vec<usize>,
}

/// A read of a room's presence, parsed.
struct PresenceRead<'a> {
    i: usize,
    t0: u64,
    t1: u64,
    via: &'a str,
    room: &'a str,
    round: Option<u32>,
    served: Result<(u64, Vec<String>), String>,
}

/// What the presence checks read of the history.
pub(super) struct PresenceHistory<'a> {
    streams: Vec<Stream<'a>>,
    reads: Vec<PresenceRead<'a>>,
    /// Node -> intervals it was killed, paused or cut off from the brokers.
    silences: BTreeMap<&'a str, Vec<(u64, u64)>>,
    /// Intervals some broker was faulted.
    brokers: Vec<(u64, u64)>,
}

impl<'a> PresenceHistory<'a> {
    fn new(ops: &'a [crate::history::Op]) -> PresenceHistory<'a> {
        let mut streams: Vec<Stream> = Vec::new();
        let mut open: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        let mut reads = Vec::new();
        let mut started: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        let mut silences: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        let mut brokers = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match &op.event {
                Event::PresenceOpen {
                    member, room, via, ..
                } => {
                    open.insert((member.as_str(), via.as_str()), streams.len());
                    streams.push(Stream {
                        member,
                        room,
                        via,
                        t0: op.t0,
                        answered: Some(op.t1),
                        closed: None,
                        ops: vec![i],
                    });
                }
                Event::PresenceClose { member, via, .. } => {
                    if let Some(s) = open
                        .remove(&(member.as_str(), via.as_str()))
                        .and_then(|j| streams.get_mut(j))
                    {
                        s.closed = Some(op.t1);
                        s.ops.push(i);
                    }
                }
                Event::PresenceUnanswered {
                    member, room, via, ..
                } => streams.push(Stream {
                    member,
                    room,
                    via,
                    t0: op.t0,
                    answered: None,
                    closed: Some(op.t1),
                    ops: vec![i],
                }),
                Event::PresenceRead {
                    via,
                    room,
                    round,
                    status,
                    payload,
                } => {
                    let served = match (status, payload) {
                        (200, Some(p)) => parse(p, room),
                        (s, p) => Err(format!(
                            "status {s}: {}",
                            p.as_deref()
                                .unwrap_or("")
                                .chars()
                                .take(120)
                                .collect::<String>()
                        )),
                    };
                    reads.push(PresenceRead {
                        i,
                        t0: op.t0,
                        t1: op.t1,
                        via,
                        room,
                        round: *round,
                        served,
                    });
                }
                Event::Fault {
                    fault,
                    target,
                    phase,
                    ..
                } => {
                    // The nemesis' faults of a node, and the run's own at
                    // its end (`quiet-pause-node`, `final-kill-node`...).
                    let node_fault = ["kill-node", "pause-node", "isolate-node"]
                        .iter()
                        .any(|f| fault.ends_with(f));
                    let broker_fault = matches!(
                        fault.as_str(),
                        "kill-broker"
                            | "pause-broker"
                            | "isolate-broker"
                            | "kill-leader"
                            | "move-leader"
                    );
                    if fault == "unsettled" {
                        // Something was not back in a minute after a fault.
                        let span = (op.t1.saturating_sub(60_000 * MS), op.t1);
                        if target == "brokers" {
                            brokers.push(span);
                        } else {
                            silences.entry(target.as_str()).or_default().push(span);
                        }
                    } else if node_fault || broker_fault {
                        let key = (fault.as_str(), target.as_str());
                        match phase {
                            Phase::Start => {
                                started.insert(key, op.t1);
                            }
                            Phase::End => {
                                let s = started.remove(&key).unwrap_or(op.t0);
                                if node_fault {
                                    silences
                                        .entry(target.as_str())
                                        .or_default()
                                        .push((s, op.t1));
                                } else {
                                    brokers.push((s, op.t1));
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        // Faults begun and never ended: until the end of the history.
        for ((fault, target), s) in started {
            if fault.ends_with("-node") {
                silences.entry(target).or_default().push((s, u64::MAX));
            } else {
                brokers.push((s, u64::MAX));
            }
        }
        PresenceHistory {
            streams,
            reads,
            silences,
            brokers,
        }
    }

    fn silenced_within(&self, node: &str, from: u64, to: u64) -> bool {
        self.silences
            .get(node)
            .is_some_and(|v| v.iter().any(|&(s, e)| s <= to && e >= from))
    }

    /// The node silenced over all of `[from, to]` by one fault.
    fn silenced_throughout(&self, node: &str, from: u64, to: u64) -> bool {
        self.silence_over(node, from, to).is_some()
    }

    /// When the fault that silenced the node over all of `[from, to]` began.
    fn silence_over(&self, node: &str, from: u64, to: u64) -> Option<u64> {
        self.silences
            .get(node)?
            .iter()
            .find(|&&(s, e)| s <= from && e >= to)
            .map(|&(s, _)| s)
    }

    /// When a stream stops counting, as its node can see it: its close, or
    /// when its node's fault around the close ended, plus a heartbeat.
    fn effective_end(&self, s: &Stream) -> Option<u64> {
        let closed = s.closed?;
        let after_fault = self.silences.get(s.via).and_then(|v| {
            v.iter()
                .filter(|&&(a, e)| a <= closed && e.saturating_add(500 * MS) >= s.t0)
                .map(|&(_, e)| e)
                .max()
        });
        Some(match after_fault {
            Some(e) if e >= closed.saturating_sub(500 * MS) => {
                e.max(closed).saturating_add(HEARTBEAT_MS * MS)
            }
            _ => closed,
        })
    }

    fn streams_of<'s>(
        &'s self,
        room: &'s str,
        member: &'s str,
    ) -> impl Iterator<Item = &'s Stream<'a>> {
        self.streams
            .iter()
            .filter(move |s| s.room == room && s.member == member)
    }
}

fn parse(payload: &str, room: &str) -> Result<(u64, Vec<String>), String> {
    let s: Served = serde_json::from_str(payload)
        .map_err(|e| format!("not a presence payload ({e}): {payload}"))?;
    if s.k != format!("{room}~presence") {
        return Err(format!("served k {:?} for room {room}", s.k));
    }
    let members = s
        .members
        .ok_or_else(|| format!("no members listed (count {})", s.count))?;
    let ids: Vec<String> = members.into_iter().map(|m| m.id).collect();
    if ids.len() as u64 != s.count {
        return Err(format!(
            "count {} but {} members listed",
            s.count,
            ids.len()
        ));
    }
    Ok((s.ver, ids))
}

fn secs(t: u64) -> String {
    format!("{:.1} s", t as f64 / 1e6)
}

impl<'a> Checker<'a> {
    /// Whether the history has presence operations at all.
    pub(super) fn has_presence(&self) -> bool {
        self.ops
            .iter()
            .any(|o| matches!(o.event, Event::PresenceRead { .. }))
    }

    pub(super) fn presence_checks(&mut self) {
        let h = PresenceHistory::new(self.ops);
        self.presence_figures(&h);
        self.presence_agreement(&h);
        self.presence_members(&h);
        self.presence_dead_expired(&h);
    }

    fn presence_figures(&mut self, h: &PresenceHistory) {
        let f = &mut self.report.figures;
        f.presence_opens = h.streams.iter().filter(|s| s.answered.is_some()).count() as u64;
        f.presence_unanswered = h.streams.iter().filter(|s| s.answered.is_none()).count() as u64;
        f.presence_reads = h.reads.len() as u64;
    }

    /// Every node of a final round serves one version and one member list
    /// per room.
    fn presence_agreement(&mut self, h: &PresenceHistory) {
        let mut by: BTreeMap<(u32, &str), Vec<&PresenceRead>> = BTreeMap::new();
        for r in &h.reads {
            if let Some(round) = r.round {
                by.entry((round, r.room)).or_default().push(r);
            }
        }
        for ((round, room), reads) in by {
            let mut first: Option<(&str, u64, &Vec<String>, usize)> = None;
            for r in &reads {
                match &r.served {
                    Err(e) => self.violate(
                        Property::PresenceAgreement,
                        Some(room),
                        format!("round {round}: node {} served no presence: {e}", r.via),
                        vec![r.i],
                    ),
                    Ok((ver, ids)) => match first {
                        None => first = Some((r.via, *ver, ids, r.i)),
                        Some((node, v0, ids0, i0)) => {
                            if (*ver, ids) != (v0, ids0) {
                                self.violate(
                                    Property::PresenceAgreement,
                                    Some(room),
                                    format!(
                                        "round {round}: node {} serves ver {ver} members {ids:?}, node {node} serves ver {v0} members {ids0:?}",
                                        r.via
                                    ),
                                    vec![i0, r.i],
                                );
                            }
                        }
                    },
                }
            }
        }
    }

    /// Each final read lists exactly the members with a stream open.
    fn presence_members(&mut self, h: &PresenceHistory) {
        let mut unjudged = 0;
        let mut judged = 0;
        for r in h.reads.iter().filter(|r| r.round.is_some()) {
            let Ok((_, listed)) = &r.served else {
                continue; // presence-agreement says why
            };
            let round = r.round.unwrap_or(0);
            let listed: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
            let members: BTreeSet<&str> = h
                .streams
                .iter()
                .filter(|s| s.room == r.room)
                .map(|s| s.member)
                .collect();
            for id in &listed {
                if !members.contains(id) {
                    self.violate(
                        Property::PresenceMembers,
                        Some(r.room),
                        format!(
                            "round {round}: node {} lists {id}, which never had a stream to this room",
                            r.via
                        ),
                        vec![r.i],
                    );
                }
            }
            for m in members {
                let streams: Vec<&Stream> = h.streams_of(r.room, m).collect();
                // Open on a node not faulted, since well before the read, and
                // closed (if ever) only after it.
                let held = streams.iter().find(|s| {
                    s.closed.is_none_or(|c| c > r.t1)
                        && s.answered.is_some_and(|a| a + JOIN_MS * MS <= r.t0)
                        && !h.silenced_within(s.via, r.t0.saturating_sub(QUIET_MS * MS), r.t1)
                });
                let gone = streams.iter().all(|s| {
                    s.t0 > r.t1
                        || h.effective_end(s)
                            .is_some_and(|e| e.saturating_add(QUIET_MS * MS) <= r.t0)
                        || h.silenced_throughout(
                            s.via,
                            r.t0.saturating_sub((LEASE_MS + MARGIN_MS) * MS),
                            r.t1,
                        )
                });
                let is_listed = listed.contains(m);
                match (held, gone) {
                    (Some(s), _) if !is_listed => {
                        judged += 1;
                        self.violate(
                            Property::PresenceMembers,
                            Some(r.room),
                            format!(
                                "round {round}: node {} does not list {m}, whose stream to node {} has been open since {} (read at {}); expected listed, served {:?}",
                                r.via,
                                s.via,
                                secs(s.answered.unwrap_or(s.t0)),
                                secs(r.t0),
                                listed
                            ),
                            [s.ops.clone(), vec![r.i]].concat(),
                        );
                    }
                    (None, true) if is_listed => {
                        judged += 1;
                        let last = streams.iter().max_by_key(|s| s.t0);
                        self.violate(
                            Property::PresenceMembers,
                            Some(r.room),
                            format!(
                                "round {round}: node {} lists {m}, whose streams all ended (or whose node is dead) more than the grace + lease + {MARGIN_MS} ms before the read at {}; last: to node {}, opened {}, ended {}; expected absent, served {:?}",
                                r.via,
                                secs(r.t0),
                                last.map_or("-", |s| s.via),
                                last.map_or("-".into(), |s| secs(s.t0)),
                                last.and_then(|s| s.closed).map_or("never".into(), secs),
                                listed
                            ),
                            [last.map(|s| s.ops.clone()).unwrap_or_default(), vec![r.i]].concat(),
                        );
                    }
                    (Some(_), _) | (None, true) => judged += 1,
                    (None, false) => unjudged += 1,
                }
            }
        }
        self.report.figures.presence_judged = judged;
        self.report.figures.presence_unjudged = unjudged;
    }

    /// During the run: no member of a dead (or silenced) node listed by a
    /// healthy node past the lease.
    fn presence_dead_expired(&mut self, h: &PresenceHistory) {
        let mut eligible = 0;
        let mut while_silent = 0;
        for r in h.reads.iter().filter(|r| r.round.is_none()) {
            let Ok((_, listed)) = &r.served else {
                continue;
            };
            let lease_back = r.t0.saturating_sub((LEASE_MS + MARGIN_MS) * MS);
            if h.silenced_within(r.via, lease_back.saturating_sub(2_000 * MS), r.t1) {
                continue; // the reading node's own view may be stale
            }
            let settle_back = lease_back.saturating_sub(BROKERS_SETTLE_MS * MS);
            if h.brokers
                .iter()
                .any(|&(s, e)| s <= r.t1 && e >= settle_back)
            {
                continue; // the presence topic may have stalled
            }
            eligible += 1;
            if h.silences
                .keys()
                .any(|n| *n != r.via && h.silenced_throughout(n, lease_back, r.t1 + 200 * MS))
            {
                while_silent += 1;
            }
            for m in listed {
                let streams: Vec<&Stream> =
                    h.streams_of(r.room, m).filter(|s| s.t0 <= r.t1).collect();
                let dead = |s: &&Stream| {
                    h.effective_end(s)
                        .is_some_and(|e| e.saturating_add(QUIET_MS * MS) <= r.t0)
                        || h.silenced_throughout(s.via, lease_back, r.t1 + 200 * MS)
                };
                if !streams.is_empty() && streams.iter().all(dead) {
                    let s = streams.iter().max_by_key(|s| s.t0).copied();
                    let why = match s {
                        Some(s) => match h.silence_over(s.via, lease_back, r.t1 + 200 * MS) {
                            Some(since) => format!(
                                "its stream (opened {}) is held by node {}, killed, paused or cut off from the brokers since {}",
                                secs(s.t0),
                                s.via,
                                secs(since)
                            ),
                            None => format!(
                                "its last stream (to node {}, opened {}) ended at {}",
                                s.via,
                                secs(s.t0),
                                s.closed.map_or("never".into(), secs)
                            ),
                        },
                        None => String::new(),
                    };
                    self.violate(
                        Property::PresenceDeadExpired,
                        Some(r.room),
                        format!(
                            "node {} lists {m} at {}: {why}, more than the lease + {MARGIN_MS} ms (grace too, for an ended stream) before; expected absent, served {listed:?}",
                            r.via,
                            secs(r.t0),
                        ),
                        [s.map(|s| s.ops.clone()).unwrap_or_default(), vec![r.i]].concat(),
                    );
                }
            }
        }
        self.report.figures.presence_reads_judged = eligible;
        self.report.figures.presence_reads_judged_silent = while_silent;
    }
}

#[cfg(test)]
mod tests {
    use crate::checker::{check, Property};
    use crate::history::{Event, Op, Phase};

    const S: u64 = 1_000_000;

    fn op(t0: u64, t1: u64, event: Event) -> Op {
        Op {
            t0,
            t1,
            process: "presence".into(),
            event,
        }
    }
    fn open(t: u64, member: &str, via: &str) -> Op {
        op(
            t,
            t + 1_000,
            Event::PresenceOpen {
                member: member.into(),
                room: "pr1/".into(),
                via: via.into(),
                run: None,
            },
        )
    }
    fn close(t: u64, member: &str, via: &str) -> Op {
        op(
            t,
            t,
            Event::PresenceClose {
                member: member.into(),
                room: "pr1/".into(),
                via: via.into(),
                cause: "broken: stream ended".into(),
            },
        )
    }
    fn read(t: u64, via: &str, round: Option<u32>, ver: u64, ids: &[&str]) -> Op {
        let members: Vec<String> = ids.iter().map(|i| format!(r#"{{"id":"{i}"}}"#)).collect();
        op(
            t,
            t + 1_000,
            Event::PresenceRead {
                via: via.into(),
                room: "pr1/".into(),
                round,
                status: 200,
                payload: Some(format!(
                    r#"{{"k":"pr1/~presence","ver":{ver},"count":{},"members":[{}]}}"#,
                    ids.len(),
                    members.join(",")
                )),
            },
        )
    }
    fn kill(t: u64, node: &str, phase: Phase) -> Op {
        op(
            t,
            t,
            Event::Fault {
                fault: "final-kill-node".into(),
                target: node.into(),
                phase,
                detail: None,
            },
        )
    }

    /// a-m0 on a, b-m0 on b; round 1 both listed everywhere; b killed for
    /// good; round 2: only a-m0.
    fn good() -> Vec<Op> {
        vec![
            open(S, "a-m0", "a"),
            open(S, "b-m0", "b"),
            read(2 * S, "a", None, 5, &["a-m0", "b-m0"]),
            read(10 * S, "a", Some(1), 7, &["a-m0", "b-m0"]),
            read(10 * S, "b", Some(1), 7, &["a-m0", "b-m0"]),
            kill(11 * S, "b", Phase::Start),
            close(11 * S + 200_000, "b-m0", "b"),
            read(12 * S, "a", None, 7, &["a-m0", "b-m0"]),
            read(17 * S, "a", None, 9, &["a-m0"]),
            read(18 * S, "a", Some(2), 9, &["a-m0"]),
            read(18 * S, "c", Some(2), 9, &["a-m0"]),
        ]
    }

    fn broken(ops: &[Op]) -> Vec<Property> {
        let r = check(ops);
        assert!(r.checked.contains(&Property::PresenceMembers), "{r}");
        r.broken().into_iter().collect()
    }

    #[test]
    fn a_history_that_keeps_the_presence_promises_is_valid() {
        assert_eq!(broken(&good()), Vec::<Property>::new());
    }

    #[test]
    fn a_dead_nodes_member_listed_after_the_lease_is_caught() {
        let mut h = good();
        h.push(read(19 * S, "a", None, 9, &["a-m0", "b-m0"]));
        h.push(read(19 * S, "a", Some(2), 9, &["a-m0", "b-m0"]));
        assert_eq!(
            broken(&h),
            [
                Property::PresenceAgreement,
                Property::PresenceMembers,
                Property::PresenceDeadExpired
            ]
        );
        let r = check(&h);
        assert!(
            r.violations
                .iter()
                .any(|v| v.what.contains("node a lists b-m0") && v.key.as_deref() == Some("pr1/")),
            "{r}"
        );
    }

    #[test]
    fn a_live_member_missing_or_nodes_disagreeing_is_caught() {
        let mut h = good();
        h[4] = read(10 * S, "b", Some(1), 8, &["b-m0"]);
        assert_eq!(
            broken(&h),
            [Property::PresenceAgreement, Property::PresenceMembers]
        );
    }

    #[test]
    fn a_member_near_its_open_or_close_is_not_judged() {
        let mut h = good();
        // Opened just before the final read: listed or not, either is right.
        h.insert(3, open(10 * S - 500_000, "a-m1", "a"));
        h.insert(6, close(10 * S + 500_000, "a-m1", "a"));
        assert_eq!(broken(&h), Vec::<Property>::new());
        assert_eq!(check(&h).figures.presence_unjudged, 2);
    }
}
