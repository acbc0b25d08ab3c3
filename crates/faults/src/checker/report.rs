//! The checker's verdict: the promises it tests ([`Property`]), each broken
//! one found ([`Violation`]), what the run did in numbers ([`Figures`]), and
//! how the verdict reads when printed (the last line `VALID` or `INVALID`).
//!
//! What it is not: the checks themselves (the sibling modules fill a
//! [`Report`] in), nor what the run does with the verdict (the exit status
//! is `main`'s).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

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
    PresenceAgreement,
    PresenceMembers,
    PresenceDeadExpired,
}

impl Property {
    pub const ALL: [Property; 15] = [
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
        Property::PresenceAgreement,
        Property::PresenceMembers,
        Property::PresenceDeadExpired,
    ];
    /// Those checked from the history alone, those that need the topic
    /// read at the end, those of presence (docs/presence.md).
    pub const HISTORY: std::ops::Range<usize> = 0..6;
    pub const LOG: std::ops::Range<usize> = 6..12;
    pub const PRESENCE: std::ops::Range<usize> = 12..15;

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
            Property::PresenceAgreement => "presence-agreement",
            Property::PresenceMembers => "presence-members",
            Property::PresenceDeadExpired => "presence-dead-expired",
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
    /// Presence streams answered, sent and not answered, presence reads.
    pub presence_opens: u64,
    pub presence_unanswered: u64,
    pub presence_reads: u64,
    /// Members judged (and not: an open or close too near) in final reads.
    pub presence_judged: u64,
    pub presence_unjudged: u64,
    /// Reads during the run judged for dead members (a healthy node, the
    /// brokers left alone).
    pub presence_reads_judged: u64,
    /// Of those, reads while another node had been killed, paused or cut
    /// off for more than the lease + margin.
    pub presence_reads_judged_silent: u64,
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
        write!(f, "lost: {}, duplicated: {}", self.lost, self.duplicated)?;
        if self.presence_reads > 0 {
            write!(
                f,
                "\npresence: {} streams opened ({} more sent and unanswered), {} reads ({} during the run judged for dead members, {} of them while another node was silent past its lease); final reads: {} member listings judged, {} not (an open or close too near)",
                self.presence_opens,
                self.presence_unanswered,
                self.presence_reads,
                self.presence_reads_judged,
                self.presence_reads_judged_silent,
                self.presence_judged,
                self.presence_unjudged
            )?;
        }
        Ok(())
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
