//! What a record did (`pollbox_log_records_total{result}`): the apply's
//! outcome, and, once the node caught up, a replay that is none. Mapped to
//! its label in one place ([`RecordResult::label`]); counted on the thread
//! and added to the log's counters once a pass ([`RecordCounts`]).

use super::LogState;
use pollbox_core::log::Outcome;

/// What a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordResult {
    /// Its box is at its version now.
    Applied,
    /// A tombstone removed its box.
    Deleted,
    /// A tombstone that found no box older than itself.
    NoBox,
    /// Its box holds it already: a replay after a restart.
    Replayed,
    /// Not a valid message: skipped, logged.
    Invalid,
    /// Not in its key's home partition (a producer that does not partition
    /// by murmur2): applied by no node, logged.
    WrongPartition,
    /// Older than its box, read after the node caught up, so not a replay
    /// (never expected: a key's records are in one partition).
    OutOfOrder,
    /// A migration's marker (`pollbox migrate`): no box touched; the
    /// partition's versions go on past it.
    Marker,
}

impl RecordResult {
    pub(crate) const COUNT: usize = 8;
    pub(crate) const ALL: [RecordResult; RecordResult::COUNT] = [
        RecordResult::Applied,
        RecordResult::Deleted,
        RecordResult::NoBox,
        RecordResult::Replayed,
        RecordResult::Invalid,
        RecordResult::WrongPartition,
        RecordResult::OutOfOrder,
        RecordResult::Marker,
    ];

    /// What a record whose apply had `outcome` did; `caught_up`: the node
    /// had applied the log up to its end at start before it (a record its
    /// box holds is then out of order, not a replay).
    #[inline]
    pub(crate) fn of(outcome: &Outcome, caught_up: bool) -> RecordResult {
        match outcome {
            Outcome::Applied { .. } => RecordResult::Applied,
            Outcome::Deleted { .. } => RecordResult::Deleted,
            Outcome::NoBox => RecordResult::NoBox,
            Outcome::Replayed if caught_up => RecordResult::OutOfOrder,
            Outcome::Replayed => RecordResult::Replayed,
            Outcome::WrongPartition { .. } => RecordResult::WrongPartition,
            Outcome::Invalid(_) => RecordResult::Invalid,
            Outcome::Marker { .. } | Outcome::Begin => RecordResult::Marker,
        }
    }

    /// The label of `pollbox_log_records_total{result}`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RecordResult::Applied => "applied",
            RecordResult::Deleted => "deleted",
            RecordResult::NoBox => "no_box",
            RecordResult::Replayed => "replayed",
            RecordResult::Invalid => "invalid",
            RecordResult::WrongPartition => "wrong_partition",
            RecordResult::OutOfOrder => "out_of_order",
            RecordResult::Marker => "marker",
        }
    }
}

/// Records by result, counted on the thread and added to the log's counters
/// when a pass hands over (an atomic add a record, shared by every consuming
/// thread, would bounce its cache line between them).
#[derive(Debug, Default)]
pub(crate) struct RecordCounts([u64; RecordResult::COUNT]);

impl RecordCounts {
    #[inline]
    pub(crate) fn add(&mut self, r: RecordResult) {
        self.0[r as usize] += 1;
    }

    /// Records counted since the last flush.
    pub(crate) fn held(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Add the counts to the log's, and start again.
    pub(crate) fn flush(&mut self, log: &LogState) {
        for (r, n) in RecordResult::ALL.into_iter().zip(&mut self.0) {
            if *n > 0 {
                log.add_records(r, std::mem::take(n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollbox_core::log::Invalid;

    #[test]
    fn each_outcome_has_its_result_and_a_late_replay_is_out_of_order() {
        let cases = [
            (Outcome::Applied { version: 3 }, RecordResult::Applied),
            (Outcome::Deleted { version: 3 }, RecordResult::Deleted),
            (Outcome::NoBox, RecordResult::NoBox),
            (Outcome::Replayed, RecordResult::Replayed),
            (
                Outcome::WrongPartition { home: 1 },
                RecordResult::WrongPartition,
            ),
            (Outcome::Invalid(Invalid::KeyNotUtf8), RecordResult::Invalid),
            (Outcome::Marker { version: 9 }, RecordResult::Marker),
            (Outcome::Begin, RecordResult::Marker),
        ];
        for (outcome, want) in cases {
            assert_eq!(RecordResult::of(&outcome, false), want, "{outcome:?}");
            let late = if want == RecordResult::Replayed {
                RecordResult::OutOfOrder
            } else {
                want
            };
            assert_eq!(RecordResult::of(&outcome, true), late, "{outcome:?}");
        }
    }

    #[test]
    fn labels_are_the_metrics_and_all_is_in_order() {
        let labels: Vec<_> = RecordResult::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "applied",
                "deleted",
                "no_box",
                "replayed",
                "invalid",
                "wrong_partition",
                "out_of_order",
                "marker"
            ]
        );
        for (i, r) in RecordResult::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    #[test]
    fn counts_are_added_to_the_log_at_a_flush() {
        let mut c = pollbox_core::config::Config::embedded().log;
        c.topic = "t".into();
        let log = LogState::new(&c, None);
        let mut counts = RecordCounts::default();
        for _ in 0..3 {
            counts.add(RecordResult::Applied);
        }
        counts.add(RecordResult::OutOfOrder);
        assert_eq!(counts.held(), 4);
        assert_eq!(log.records(RecordResult::Applied), 0);
        counts.flush(&log);
        assert_eq!(counts.held(), 0);
        assert_eq!(log.records(RecordResult::Applied), 3);
        assert_eq!(log.records(RecordResult::OutOfOrder), 1);
        assert_eq!(log.records(RecordResult::NoBox), 0);
    }
}
