//! Which topics can keep the promise that nothing acknowledged is lost
//! (docs/operations.md#the-kafka-log). A record is acknowledged once every
//! in-sync replica has it (`acks=all`); that survives the loss of a broker
//! only when there are replicas to spare and the broker refuses writes it
//! cannot replicate, and only if the log never drops a record by itself.
//!
//! What it is not: the reading of the settings (the server asks the
//! brokers); this is the rule applied to what they said.

use std::fmt;

/// What the brokers say of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSettings {
    /// The fewest replicas of any partition.
    pub replication_factor: u32,
    /// `min.insync.replicas` (the topic's, else the broker's default).
    pub min_insync_replicas: u32,
    /// `unclean.leader.election.enable`.
    pub unclean_leader_election: bool,
    /// `cleanup.policy`: `delete`, `compact` or both.
    pub cleanup_policy: String,
}

/// One setting that can lose acknowledged records, with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnsafeSetting {
    /// Fewer than 3 replicas: losing one broker leaves no spare.
    ReplicationFactor(u32),
    /// An acknowledgement that needs fewer than 2 replicas: the one that
    /// had it can die before a follower copies it.
    MinInsyncReplicas(u32),
    /// A replica that missed records may become leader and drop them.
    UncleanLeaderElection,
    /// Compaction removes all but a key's last record, and its tombstones:
    /// replays, versions and counts differ from what nodes served.
    Compacted(String),
}

impl fmt::Display for UnsafeSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnsafeSetting::ReplicationFactor(n) => write!(
                f,
                "replication factor {n} (needs at least 3: recreate the topic with --replication-factor 3, or reassign its partitions)"
            ),
            UnsafeSetting::MinInsyncReplicas(n) => write!(
                f,
                "min.insync.replicas={n} (needs at least 2: kafka-configs.sh --alter --entity-type topics --entity-name <topic> --add-config min.insync.replicas=2)"
            ),
            UnsafeSetting::UncleanLeaderElection => write!(
                f,
                "unclean.leader.election.enable=true (set it to false on the topic)"
            ),
            UnsafeSetting::Compacted(p) => write!(
                f,
                "cleanup.policy={p} (compaction drops records and tombstones: use cleanup.policy=delete)"
            ),
        }
    }
}

impl TopicSettings {
    /// Every setting of the topic that can lose acknowledged records; empty
    /// when it keeps them.
    pub fn unsafe_settings(&self) -> Vec<UnsafeSetting> {
        let mut out = Vec::new();
        if self.replication_factor < 3 {
            out.push(UnsafeSetting::ReplicationFactor(self.replication_factor));
        }
        if self.min_insync_replicas < 2 {
            out.push(UnsafeSetting::MinInsyncReplicas(self.min_insync_replicas));
        }
        if self.unclean_leader_election {
            out.push(UnsafeSetting::UncleanLeaderElection);
        }
        if self
            .cleanup_policy
            .split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("compact"))
        {
            out.push(UnsafeSetting::Compacted(self.cleanup_policy.clone()));
        }
        out
    }
}

impl fmt::Display for TopicSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "replication factor {}, min.insync.replicas={}, unclean.leader.election.enable={}, cleanup.policy={}",
            self.replication_factor,
            self.min_insync_replicas,
            self.unclean_leader_election,
            self.cleanup_policy
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safe() -> TopicSettings {
        TopicSettings {
            replication_factor: 3,
            min_insync_replicas: 2,
            unclean_leader_election: false,
            cleanup_policy: "delete".into(),
        }
    }

    #[test]
    fn three_replicas_two_in_sync_no_unclean_election_no_compaction_is_safe() {
        assert!(safe().unsafe_settings().is_empty());
        let bigger = TopicSettings {
            replication_factor: 5,
            min_insync_replicas: 3,
            ..safe()
        };
        assert!(bigger.unsafe_settings().is_empty());
    }

    #[test]
    fn each_setting_that_can_lose_records_is_named_with_its_fix() {
        let cases = [
            (
                TopicSettings {
                    replication_factor: 1,
                    ..safe()
                },
                "replication factor 1",
            ),
            (
                TopicSettings {
                    min_insync_replicas: 1,
                    ..safe()
                },
                "min.insync.replicas=1",
            ),
            (
                TopicSettings {
                    unclean_leader_election: true,
                    ..safe()
                },
                "unclean.leader.election.enable=true",
            ),
            (
                TopicSettings {
                    cleanup_policy: "compact,delete".into(),
                    ..safe()
                },
                "cleanup.policy=compact,delete",
            ),
        ];
        for (settings, said) in cases {
            let found = settings.unsafe_settings();
            assert_eq!(found.len(), 1, "{settings}: {found:?}");
            let text = found[0].to_string();
            assert!(text.starts_with(said), "{text}");
            assert!(text.contains('('), "names the fix: {text}");
        }
        // The one-broker topic of a quick try: two reasons.
        let one = TopicSettings {
            replication_factor: 1,
            min_insync_replicas: 1,
            ..safe()
        };
        assert_eq!(one.unsafe_settings().len(), 2);
    }
}
